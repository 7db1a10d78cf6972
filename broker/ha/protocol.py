"""The replication wire format: length-prefixed frames on one TCP connection per slave.

slave -> master
    hello    b"RLHA" | version u8 (2) | kind u8 | offset u64 | broker id i32 |
             epoch i32 | epoch start u64
             once: where the slave's log ends and the last epoch of its history
             (kind 0: stream from there; kind 1: a probe, answered with one `position`
             frame, then closed)
    report   offset u64                                 how far the slave has the log
                                                        (written, and fsynced under
                                                        SYNC_FLUSH); also its heartbeat
    acting   -1 i64 | length u32 | JSON                 what the slave acknowledged while
                                                        it served receives for this master
                                                        (broker.acting): after its hello,
                                                        and after each config frame while
                                                        the master's offsets lack some
master -> slave
    frame    offset u64 | length u32 | length bytes     whole records from `offset`;
                                                        length 0: a heartbeat whose
                                                        offset is the master's log end
    config   offset -1 | length u32 | JSON              the master's topics, groups,
                                                        committed offsets, delay offsets
                                                        and epoch history (config sync:
                                                        at connect, then periodically)
    position offset -2 | length u32 | JSON              the master's log end, first offset
                                                        and epoch history; the answer to a
                                                        probe, and to a slave whose log
                                                        does not continue this master's
                                                        (then with `refused`: why)
    lag      offset -3 | length 8 | messages u64        how many messages this slave lacks
                                                        (at most once a second)

Every integer is big-endian. A frame holds whole records of one commitlog file (the
slave checks each before it writes, `CommitLog.append_raw`).
"""

from __future__ import annotations

import socket
import struct

from broker.errors import BrokerError

MAGIC = b"RLHA"
VERSION = 3
HELLO = struct.Struct(">4sBBqiiq")
REPORT = struct.Struct(">q")
FRAME = struct.Struct(">qI")
LAG = struct.Struct(">q")
CONFIG_FRAME = -1  # the offset field of a config frame
POSITION_FRAME = -2  # ... of a position frame
LAG_FRAME = -3  # ... of a lag frame
ACTING_REPORT = -1  # the offset field of a slave's acting report
LENGTH = struct.Struct(">I")
HELLO_STREAM = 0
HELLO_PROBE = 1
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


def pack_hello(
    offset: int,
    *,
    broker_id: int = 1,
    epoch: tuple[int, int] = (1, 0),
    kind: int = HELLO_STREAM,
) -> bytes:
    return HELLO.pack(MAGIC, VERSION, kind, offset, broker_id, epoch[0], epoch[1])


def unpack_hello(data: bytes) -> tuple[int, int, int, tuple[int, int]]:
    """(kind, offset, broker id, (epoch, epoch start)) of a hello; HaProtocolError."""
    magic, version, kind, offset, broker_id, epoch, epoch_start = HELLO.unpack(data)
    if magic != MAGIC:
        raise HaProtocolError("not a replication client")
    if version != VERSION:
        raise HaProtocolError(f"replication protocol version {version}; this is {VERSION}")
    if kind not in (HELLO_STREAM, HELLO_PROBE):
        raise HaProtocolError(f"unknown hello kind {kind}")
    if offset < 0:
        raise HaProtocolError(f"negative offset {offset}")
    return int(kind), int(offset), int(broker_id), (int(epoch), int(epoch_start))
