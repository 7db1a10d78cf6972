"""The replication wire format: length-prefixed frames on one TCP (or TLS) connection per
slave. Protocol version 4: an authenticated handshake, and a bound on every length.

slave -> master
    hello    b"RLHA" | version u8 (4) | kind u8 | offset u64 | broker id i32 |  30 bytes,
             epoch i32 | epoch start u64                                        as in v3
             | group length u8 | group (UTF-8)          the broker group (--broker-name)
             | key length u8 | access key (UTF-8)       empty: the slave does not authenticate
             | nonce (32 bytes)                         fresh, random
             once: where the slave's log ends and the last epoch of its history
             (kind 0: stream from there; kind 1: a probe, answered with one `position`
             frame, then closed)
    proof    HMAC-SHA256(secret, "RLHA4 slave\\0" | hello | master nonce)  (32 bytes)
             after the master's challenge, when the slave authenticates
    report   offset u64                                 how far the slave has the log
                                                        (written, and fsynced under
                                                        SYNC_FLUSH); also its heartbeat.
                                                        Never beyond what the master sent
                                                        it: a report beyond is a protocol
                                                        violation, the link is dropped
    acting   -1 i64 | length u32 | JSON                 what the slave acknowledged while
                                                        it served receives for this master
                                                        (broker.acting): after its hello,
                                                        and after each config frame while
                                                        the master's offsets lack some
master -> slave
    challenge offset -4 | length 32 | nonce (32 bytes)  the master's fresh nonce, when it
                                                        authenticates its slaves
    proof    offset -5 | length 32 |                    the master's answer, once the
             HMAC-SHA256(secret, "RLHA4 master\\0" |     slave's proof checked out
             hello | master nonce | slave proof)
    frame    offset u64 | length u32 | length bytes     whole records from `offset`;
                                                        length 0: a heartbeat whose
                                                        offset is the master's log end
    config   offset -1 | length u32 | JSON              the master's topics, groups,
                                                        committed offsets, delay offsets
                                                        and epoch history (config sync:
                                                        at connect, then periodically)
    position offset -2 | length u32 | JSON              the master's log end, first offset
                                                        and epoch history; the answer to a
                                                        probe. A refusal is a position
                                                        frame holding only `refused`: why
    lag      offset -3 | length 8 | messages u64        how many messages this slave lacks
                                                        (at most once a second)

Every integer is big-endian. A frame holds whole records of one commitlog file (the
slave checks each before it writes, `CommitLog.append_raw`). Every length is checked
against what its frame type can hold (`MAX_*` below) before anything is read, and a body
is read incrementally: memory grows with the bytes that arrive, not with a length a peer
claims.
"""

from __future__ import annotations

import contextlib
import json
import struct
from typing import Protocol

from broker.errors import BrokerError

MAGIC = b"RLHA"
VERSION = 4
HELLO = struct.Struct(">4sBBqiiq")  # the fixed part of a hello (30 bytes, also version 3's)
REPORT = struct.Struct(">q")
FRAME = struct.Struct(">qI")
LAG = struct.Struct(">q")
CONFIG_FRAME = -1  # the offset field of a config frame
POSITION_FRAME = -2  # ... of a position frame
LAG_FRAME = -3  # ... of a lag frame
CHALLENGE_FRAME = -4  # ... of the master's challenge (its nonce)
PROOF_FRAME = -5  # ... of the master's proof
ACTING_REPORT = -1  # the offset field of a slave's acting report
LENGTH = struct.Struct(">I")
HELLO_STREAM = 0
HELLO_PROBE = 1
NONCE = 32  # bytes of a nonce
PROOF = 32  # bytes of an HMAC-SHA256
MAX_NAME = 255  # bytes of a group name or an access key in a hello (a u8 length)
# what each frame type can hold
MAX_ACTING_REPORT = 64 << 20  # offsets a slave acknowledged while acting: JSON
MAX_CONFIG = 256 << 20  # topics, groups, offsets of a whole broker: JSON
MAX_POSITION = 1 << 20  # two offsets, an epoch history, a reason
MAX_RECORDS = 1 << 30  # a frame of records: at most one commitlog file (the slave checks
# its own file size too, `HaSlave`)
PREALLOCATED = (1 << 20) + (64 << 10)  # a body up to this is read into one buffer at once


class HaProtocolError(BrokerError):
    """The peer broke the replication protocol (or the link): the connection is dropped."""


class Link(Protocol):
    """What the replication code uses of a connection: a socket, or a TLS link over one
    (`broker.ha.link.TlsLink`)."""

    def recv_into(self, buffer: memoryview, nbytes: int = 0) -> int: ...
    def sendall(self, data: bytes, /) -> None: ...
    def settimeout(self, value: float | None, /) -> None: ...
    def shutdown(self, how: int, /) -> None: ...
    def close(self) -> None: ...


def recv_exact(sock: Link, n: int) -> bytes:
    """Exactly `n` bytes; HaProtocolError when the peer closes first. Up to
    `PREALLOCATED` bytes are read into one buffer; beyond, the buffer grows as bytes
    arrive, so a length a peer claims and never sends costs nothing."""
    if n <= PREALLOCATED:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                raise HaProtocolError("the peer closed the connection")
            got += k
        return bytes(buf)
    out = bytearray()
    chunk = bytearray(PREALLOCATED)
    view = memoryview(chunk)
    while len(out) < n:
        k = sock.recv_into(view, min(n - len(out), PREALLOCATED))
        if k == 0:
            raise HaProtocolError("the peer closed the connection")
        out += view[:k]
    return bytes(out)


def recv_frame(sock: Link, limits: dict[int, int], default: int) -> tuple[int, bytes]:
    """One master -> slave frame: (offset, body). The length is checked against what
    the frame type can hold (`limits` by offset field; `default` for a frame of
    records) before the body is read."""
    offset, length = FRAME.unpack(recv_exact(sock, FRAME.size))
    limit = limits.get(offset, default) if offset < 0 else default
    if length > limit:
        raise HaProtocolError(f"a frame (offset {offset}) of {length} bytes, at most {limit}")
    return offset, recv_exact(sock, length) if length else b""


def _short(name: str, what: str) -> bytes:
    data = name.encode()
    if len(data) > MAX_NAME:
        raise ValueError(f"{what} longer than {MAX_NAME} bytes")
    return bytes([len(data)]) + data


def pack_hello(
    offset: int,
    *,
    broker_id: int = 1,
    epoch: tuple[int, int] = (1, 0),
    kind: int = HELLO_STREAM,
    group: str = "broker-a",
    access_key: str = "",
    nonce: bytes = bytes(NONCE),
) -> bytes:
    if len(nonce) != NONCE:
        raise ValueError(f"a nonce is {NONCE} bytes")
    fixed = HELLO.pack(MAGIC, VERSION, kind, offset, broker_id, epoch[0], epoch[1])
    return fixed + _short(group, "a group name") + _short(access_key, "an access key") + nonce


class Hello:
    """A slave's hello as the master read it (`read_hello`)."""

    def __init__(
        self,
        raw: bytes,
        kind: int,
        offset: int,
        broker_id: int,
        epoch: tuple[int, int],
        group: str,
        access_key: str,
        nonce: bytes,
    ) -> None:
        self.raw = raw  # its bytes, as the proofs sign them
        self.kind = kind
        self.offset = offset
        self.broker_id = broker_id
        self.epoch = epoch
        self.group = group
        self.access_key = access_key
        self.nonce = nonce


# why a master refuses a slave, in the position frame's `reason` (a master that names
# none is read as REFUSED_OTHER): the slave's log does not continue the master's (it
# rejoins: broker/ha/rejoin.py), or it can never replicate from this master as it is
REFUSED_HISTORY = "history"
REFUSED_GROUP = "group"
REFUSED_AUTH = "auth"
REFUSED_VERSION = "version"
REFUSED_OTHER = "other"
PERMANENT_REFUSALS = frozenset({REFUSED_GROUP, REFUSED_AUTH, REFUSED_VERSION})


class MasterRefused(HaProtocolError):
    """The master refused this slave (a position frame with `refused`): `why` it did,
    and the `reason` in one word (REFUSED_HISTORY, REFUSED_GROUP, ...)."""

    def __init__(self, why: str, reason: str = REFUSED_OTHER) -> None:
        self.why = why
        self.reason = reason
        super().__init__(f"the master refused this slave: {why}")


class VersionMismatch(HaProtocolError):
    """The peer speaks another version of the replication protocol."""


def read_hello(sock: Link) -> Hello:
    """Read and check a hello: HaProtocolError (VersionMismatch for another version)."""
    fixed = recv_exact(sock, HELLO.size)
    magic, version, kind, offset, broker_id, epoch, epoch_start = HELLO.unpack(fixed)
    if magic != MAGIC:
        raise HaProtocolError("not a replication client")
    if version != VERSION:
        raise VersionMismatch(
            f"replication protocol version {version}; this master speaks {VERSION} "
            "(run the same version on every broker of the group)"
        )
    if kind not in (HELLO_STREAM, HELLO_PROBE):
        raise HaProtocolError(f"unknown hello kind {kind}")
    if offset < 0:
        raise HaProtocolError(f"negative offset {offset}")
    raw = bytearray(fixed)
    names: list[str] = []
    for _ in range(2):
        size = recv_exact(sock, 1)
        data = recv_exact(sock, size[0]) if size[0] else b""
        raw += size + data
        try:
            names.append(data.decode())
        except UnicodeDecodeError:
            raise HaProtocolError("a name in the hello is not UTF-8") from None
    nonce = recv_exact(sock, NONCE)
    raw += nonce
    return Hello(
        bytes(raw),
        int(kind),
        int(offset),
        int(broker_id),
        (int(epoch), int(epoch_start)),
        names[0],
        names[1],
        nonce,
    )


def send_refusal(sock: Link, why: str, reason: str = REFUSED_OTHER) -> None:
    """A position frame holding only why the peer is refused (best effort)."""
    data = json.dumps({"refused": why, "reason": reason}).encode()
    with contextlib.suppress(OSError):
        sock.sendall(FRAME.pack(POSITION_FRAME, len(data)) + data)
