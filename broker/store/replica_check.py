"""What a slave checks before it appends a chunk replicated from its master
(`CommitLog.append_raw`): every record whole, its checksums and PHYSICALOFFSET right, and a
blank record only where it ends the file."""

from __future__ import annotations

from broker.store.codec import (
    BLANK,
    BLANK_MAGIC_CODE,
    END_FILE_MIN_BLANK_LENGTH,
    FIXED_SIZE,
    check_message_and_return_size,
    is_queued,
)
from broker.store.errors import ReplicaRejected


def check_replica(
    view: memoryview, offset: int, pos: int, file_size: int
) -> tuple[dict[str, int], int, int]:
    """Check every record of a replicated chunk: the topic-queue table entries it moves,
    its last store time, its number of records. `ReplicaRejected` at the first bad one."""
    updates: dict[str, int] = {}
    last_ts = 0
    count = 0
    at = 0
    n = len(view)
    while at < n:
        if n - at < END_FILE_MIN_BLANK_LENGTH:
            raise ReplicaRejected(offset + at, "a record is cut short")
        total, magic = BLANK.unpack_from(view, at)
        if magic == BLANK_MAGIC_CODE:
            if total != file_size - (pos + at) or at + total != n:
                raise ReplicaRejected(offset + at, "a blank record that does not end the file")
            return updates, last_ts, count
        if total < FIXED_SIZE or at + total > n:
            raise ReplicaRejected(offset + at, "a record is cut short")
        size, request = check_message_and_return_size(view[at : at + total], 0, True, offset + at)
        if size != total or request is None:
            raise ReplicaRejected(offset + at, "a record fails its checks")
        if is_queued(request.sys_flag):
            updates[f"{request.topic}-{request.queue_id}"] = request.queue_offset + 1
        last_ts = request.store_timestamp
        count += 1
        at += total
    return updates, last_ts, count


__all__ = ["check_replica"]
