"""Reading the commitlog: records by offset, decoded or as bytes, and record walks for
replication.

Reads take no lock: a record is readable once the writer has moved its file's
`wrote_position` past it (the append path copies a record in before it moves the
position), and a reader holds the file (`MappedFile.hold`) so cleanup never unmaps it
underneath. A version-2 record is checked against its checksum when served; a record
recovery quarantined is never served.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from broker.store import codec
from broker.store.codec import BLANK, BLANK_MAGIC_CODE
from broker.store.mapped_file import MappedFile
from broker.store.mapped_file_queue import MappedFileQueue
from broker.store.message import MessageExt

log = logging.getLogger("broker.store.commitlog")


class CommitLogReader:
    """The records of the commitlog's file queue, read without the append lock."""

    def __init__(self, queue: MappedFileQueue) -> None:
        self.queue = queue
        # check a version-2 record's checksum whenever it is served (look_message)
        self.verify_on_read = True
        # offsets of damaged records recovery kept (recovery.py): never served, any version
        self.quarantined: frozenset[int] = frozenset()
        self._reported: set[int] = set()  # damaged records already logged

    def get_message(self, offset: int, size: int) -> bytes | None:
        """Bytes [offset, offset+size) when they are all written, else None."""
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None or not mf.hold():
            return None
        try:
            pos = offset - mf.file_from_offset
            if pos < 0 or pos + size > mf.wrote_position:
                return None
            return mf.read(pos, size)
        finally:
            mf.release()

    def read_records(self, offset: int, limit: int) -> bytes:
        """Whole records from `offset` (a record's start), within one file: up to `limit`
        bytes, or the one record there when it alone is larger; a file's closing blank
        record goes with them. Empty when nothing is written there yet."""
        mf = self.queue.find_mapped_file_by_offset(offset)
        if mf is None or not mf.hold():
            return b""
        try:
            pos = offset - mf.file_from_offset
            wrote = mf.wrote_position
            if pos < 0 or pos >= wrote:
                return b""
            mm = mf.mapping
            at = pos
            while at < wrote:
                total = BLANK.unpack_from(mm, at)[0]
                if total <= 0 or at + total > wrote:  # pragma: no cover - below wrote_position
                    break
                if at > pos and at + total - pos > limit:
                    break
                at += total
            return mf.read(pos, at - pos)
        finally:
            mf.release()

    def count_records(self, start: int, end: int, limit: int) -> tuple[int, int]:
        """(messages, where the walk stopped) between two record starts of the log: walks
        record headers (blank records, which close a file, are not messages), at most
        `limit` of them, and stops early at anything not written."""
        count = 0
        at = start
        while at < end and count < limit:
            mf = self.queue.find_mapped_file_by_offset(at)
            if mf is None or not mf.hold():
                break
            try:
                base = mf.file_from_offset
                wrote = mf.wrote_position
                mm = mf.mapping
                pos = at - base
                stop = min(end - base, wrote)
                while pos < stop and count < limit:
                    total, magic = BLANK.unpack_from(mm, pos)
                    if total <= 0:  # pragma: no cover - below wrote_position
                        return count, base + pos
                    if magic == BLANK_MAGIC_CODE:
                        pos = mf.file_size
                        break
                    count += 1
                    pos += total
                if pos < mf.file_size and pos >= wrote:
                    return count, base + pos
                at = base + pos
            finally:
                mf.release()
        return count, at

    def _report_corrupt(self, offset: int, what: str) -> None:
        """Log a damaged record once (a reader may come back to it many times)."""
        if offset in self._reported:
            return
        if len(self._reported) >= 1024:
            self._reported.clear()
        self._reported.add(offset)
        log.error(
            "commitlog record at %d %s: not served (run `reliable admin store verify`)",
            offset,
            what,
        )

    def look_message(self, offset: int) -> MessageExt | None:
        """The record starting at `offset`, decoded; None when there is none, or when a
        version-2 record fails its checksum or recovery quarantined it (logged once)."""
        return self.look_messages((offset,))[0]

    def look_messages(self, offsets: Sequence[int]) -> list[MessageExt | None]:
        """`look_message` of each offset, in order: a run of records in one file holds the
        file once (a read of a batch looked each one up, held and released it)."""
        out: list[MessageExt | None] = []
        quarantined = self.quarantined
        mf: MappedFile | None = None
        start = end = 0
        try:
            for offset in offsets:
                if quarantined and offset in quarantined:
                    self._report_corrupt(offset, "was quarantined at start")
                    out.append(None)
                    continue
                if mf is None or not start <= offset < end:
                    if mf is not None:
                        mf.release()
                        mf = None
                    found = self.queue.find_mapped_file_by_offset(offset)
                    if found is None or not found.hold():
                        out.append(None)
                        continue
                    mf, start = found, found.file_from_offset
                    end = start + found.file_size
                out.append(self._look_in(mf, offset))
        finally:
            if mf is not None:
                mf.release()
        return out

    def _look_in(self, mf: MappedFile, offset: int) -> MessageExt | None:
        """The record at `offset` in `mf` (held by the caller), as `look_message`."""
        msg = codec.look_record(
            mf.mapping, offset - mf.file_from_offset, mf.wrote_position, self.verify_on_read
        )
        if msg is False:
            self._report_corrupt(offset, "fails its checksum")
            return None
        return msg
