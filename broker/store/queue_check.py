"""Does a consume-queue unit point at the record it claims? (recovery, reads, `verify`)

A unit is derived data: (commitlog offset, size, tags code) of the record at one queue
offset of one queue. A unit matches the commitlog when, at its commitlog offset, there is a
record (either version's magic code) whose TOTALSIZE is the unit's size, whose
PHYSICALOFFSET is that offset, whose QUEUEID and QUEUEOFFSET are the queue's and the unit's
position, and whose topic is the queue's. These checks read the record's header and topic
only (no checksum): cheap enough to run over every unit at start.

`UnitChecker` resolves commitlog offsets to mapped buffers; the store builds one over its
commitlog files, `verify` over files it maps read-only.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Callable

from broker.store.codec import FIXED_SIZE, HEADER_SIZE, RECORD_MAGIC_CODES

# TOTALSIZE MAGICCODE [CRC] QUEUEID [FLAG] QUEUEOFFSET PHYSICALOFFSET ... BODYLEN at 84
_HEAD = struct.Struct(">ii4xi4xqq")
_BODYLEN = struct.Struct(">i")

Buffer = mmap.mmap | bytes | bytearray | memoryview
# commitlog offset -> (buffer holding it, the offset of buffer[0]) or None when no file does
Locate = Callable[[int], tuple[Buffer, int] | None]


def unit_problem(
    buf: Buffer, pos: int, phy: int, size: int, topic: bytes, queue_id: int, queue_offset: int
) -> str | None:
    """What is wrong with the unit (phy, size) at `queue_offset` of `topic`-`queue_id`, the
    record's bytes starting at buf[pos]; None when it matches."""
    if pos < 0 or pos + FIXED_SIZE > len(buf):
        return f"points at {phy}, outside the commitlog's files"
    total, magic, qid, qoff, phy_field = _HEAD.unpack_from(buf, pos)
    if magic not in RECORD_MAGIC_CODES or phy_field != phy:
        return f"points at {phy}, which is not the start of a record"
    problems = []
    if total != size:
        problems.append(f"size {size} but the record's is {total}")
    if qid != queue_id:
        problems.append(f"the record is of queue {qid}")
    if qoff != queue_offset:
        problems.append(f"the record is at queue offset {qoff}")
    if not problems:
        (blen,) = _BODYLEN.unpack_from(buf, pos + HEADER_SIZE - 4)
        at = pos + HEADER_SIZE + blen
        if (
            blen < 0
            or at + 1 + len(topic) > min(len(buf), pos + total)
            or buf[at] != len(topic)
            or bytes(buf[at + 1 : at + 1 + len(topic)]) != topic
        ):
            problems.append("the record is of another topic")
    if problems:
        return f"points at the record at {phy}, but " + ", ".join(problems)
    return None


class UnitChecker:
    """Checks units against a commitlog given as mapped files (see `Locate`)."""

    def __init__(self, locate: Locate, commitlog_min: int, commitlog_end: int) -> None:
        self._locate = locate
        self.commitlog_min = commitlog_min
        self.commitlog_end = commitlog_end

    def problem(
        self, topic: bytes, queue_id: int, queue_offset: int, phy: int, size: int
    ) -> str | None:
        """None when the unit matches or points below the commitlog's min (expired)."""
        if phy < self.commitlog_min:
            return None
        if size <= 0 or phy + size > self.commitlog_end:
            return f"points at {phy} (size {size}), past the commitlog's end {self.commitlog_end}"
        found = self._locate(phy)
        if found is None:
            return f"points at {phy}, in no commitlog file"
        buf, base = found
        return unit_problem(buf, phy - base, phy, size, topic, queue_id, queue_offset)
