"""The replication wire format: length-prefixed frames on one TCP connection per slave.

slave -> master
    hello    b"RLHA" | version u8 (1) | offset u64     once: where the slave's log ends
    report   offset u64                                 how far the slave has the log
                                                        (written, and fsynced under
                                                        SYNC_FLUSH); also its heartbeat
master -> slave
    frame    offset u64 | length u32 | length bytes     whole records from `offset`;
                                                        length 0: a heartbeat whose
                                                        offset is the master's log end
    config   offset -1 | length u32 | JSON              the master's topics, groups and
                                                        committed offsets (config sync:
                                                        at connect, then periodically)

Every integer is big-endian. A frame holds whole records of one commitlog file (the
slave checks each before it writes, `CommitLog.append_raw`).
"""

from __future__ import annotations

import socket
import struct

from broker.errors import BrokerError

MAGIC = b"RLHA"
VERSION = 1
HELLO = struct.Struct(">4sBq")
REPORT = struct.Struct(">q")
FRAME = struct.Struct(">qI")
CONFIG_FRAME = -1  # the offset field of a config frame
MAX_FRAME = 1 << 30  # larger than any commitlog file: a corrupt length, not a record


class HaProtocolError(BrokerError):
    """The peer broke the replication protocol (or the link): the connection is dropped."""


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Exactly `n` bytes; HaProtocolError when the peer closes first."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise HaProtocolError("the peer closed the connection")
        got += k
    return bytes(buf)


def pack_hello(offset: int) -> bytes:
    return HELLO.pack(MAGIC, VERSION, offset)


def unpack_hello(data: bytes) -> int:
    magic, version, offset = HELLO.unpack(data)
    if magic != MAGIC:
        raise HaProtocolError("not a replication client")
    if version != VERSION:
        raise HaProtocolError(f"replication protocol version {version}; this is {VERSION}")
    if offset < 0:
        raise HaProtocolError(f"negative offset {offset}")
    return int(offset)
