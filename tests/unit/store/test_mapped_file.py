"""Mapped files and the mapped file queue: naming, positions, roll-over, truncation, deletion."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from broker.store.errors import ForeignFile
from broker.store.mapped_file import MappedFile, file_name
from broker.store.mapped_file_queue import MappedFileAllocator, MappedFileQueue

SIZE = 4096


def test_create_append_read_flush(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / file_name(0), SIZE)
    assert mf.file_from_offset == 0
    assert (tmp_path / "00000000000000000000").stat().st_size == SIZE
    assert mf.append(b"abc") == 0
    assert mf.append(b"defg") == 3
    assert mf.read(1, 4) == b"bcde"
    assert mf.remaining() == SIZE - 7
    assert mf.flushed_position == 0
    assert mf.flush(least_pages=1) == 0  # less than a page dirty: not yet
    assert mf.flush() == 7
    mf.close()
    again = MappedFile(tmp_path / file_name(0), SIZE)
    assert again.read(0, 7) == b"abcdefg"
    again.close()


def test_foreign_names_and_sizes(tmp_path: Path) -> None:
    with pytest.raises(ForeignFile):
        MappedFile(tmp_path / "123", SIZE)
    (tmp_path / file_name(0)).write_bytes(b"x" * 100)
    with pytest.raises(ForeignFile, match="size 100"):
        MappedFile(tmp_path / file_name(0), SIZE)


def test_append_past_end_is_refused(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / file_name(0), SIZE)
    mf.append(bytes(SIZE - 2))
    with pytest.raises(ValueError):
        mf.append(b"abc")
    assert mf.wrote_position == SIZE - 2
    mf.close()


def test_hold_blocks_destroy_until_released(tmp_path: Path) -> None:
    now = [0]
    mf = MappedFile(tmp_path / file_name(0), SIZE, clock=lambda: now[0])
    assert mf.hold()
    view = mf.buffer()
    assert not mf.destroy(1000)
    assert mf.path.exists()
    assert not mf.hold()  # shutting down: no new holders
    view.release()
    mf.release()
    assert mf.destroy(1000)
    assert not mf.path.exists()


def test_destroy_forcibly_after_interval(tmp_path: Path) -> None:
    now = [0]
    mf = MappedFile(tmp_path / file_name(0), SIZE, clock=lambda: now[0])
    assert mf.hold()
    assert not mf.destroy(1000)
    now[0] = 999
    assert not mf.destroy(1000)
    now[0] = 1000
    assert mf.destroy(1000)
    assert not mf.path.exists()


def test_warm_keeps_written_bytes(tmp_path: Path) -> None:
    mf = MappedFile(tmp_path / file_name(0), SIZE * 4)
    mf.append(b"keep me")
    mf.warm(flush=True)
    assert mf.read(0, 7) == b"keep me"
    mf.close()


def test_queue_rolls_and_finds_by_offset(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SIZE)
    q.load()
    assert q.get_last_mapped_file(create=False) is None
    for _ in range(5):
        mf = q.get_last_mapped_file()
        assert mf is not None
        mf.append(bytes(SIZE))
    assert [m.file_from_offset for m in q.mapped_files] == [0, SIZE, 2 * SIZE, 3 * SIZE, 4 * SIZE]
    assert q.get_max_offset() == 5 * SIZE
    found = q.find_mapped_file_by_offset(2 * SIZE + 17)
    assert found is not None and found.file_from_offset == 2 * SIZE
    assert q.find_mapped_file_by_offset(99 * SIZE) is None
    assert q.flush_to(q.get_max_offset()) == 5 * SIZE
    q.shutdown(0)


def test_queue_starts_at_the_given_offset(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SIZE)
    mf = q.get_last_mapped_file(start_offset=3 * SIZE + 5)
    assert mf is not None and mf.path.name == file_name(3 * SIZE)
    q.shutdown(0)


def test_load_rejects_foreign_files_and_gaps(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SIZE)
    for _ in range(3):
        mf = q.get_last_mapped_file()
        assert mf is not None
        mf.append(bytes(SIZE))
    q.shutdown(0)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ForeignFile, match="20-digit"):
        MappedFileQueue(tmp_path, SIZE).load()
    (tmp_path / "notes.txt").unlink()
    os.unlink(tmp_path / file_name(SIZE))
    with pytest.raises(ForeignFile, match="gap"):
        MappedFileQueue(tmp_path, SIZE).load()
    os.truncate(tmp_path / file_name(2 * SIZE), 10)
    with pytest.raises(ForeignFile):
        MappedFileQueue(tmp_path, SIZE).load()


def test_truncate_dirty_files_zeroes_the_tail(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SIZE)
    for i in range(3):
        mf = q.get_last_mapped_file()
        assert mf is not None
        mf.append(bytes([i + 1]) * SIZE)
    q.truncate_dirty_files(SIZE + 100)
    assert [m.file_from_offset for m in q.mapped_files] == [0, SIZE]
    assert q.get_max_offset() == SIZE + 100
    assert not (tmp_path / file_name(2 * SIZE)).exists()
    last = q.mapped_files[-1]
    assert last.read(0, 100) == b"\x02" * 100
    assert last.read(100, SIZE - 100) == bytes(SIZE - 100)
    q.shutdown(0)


def test_delete_expired_by_time_never_deletes_the_last(tmp_path: Path) -> None:
    q = MappedFileQueue(tmp_path, SIZE)
    for _ in range(4):
        mf = q.get_last_mapped_file()
        assert mf is not None
        mf.append(bytes(SIZE))
    naps: list[float] = []
    n = q.delete_expired_file_by_time(0, 10, 1000, False, 2, now_ms=1 << 60, sleep=naps.append)
    assert n == 2 and naps == [0.01]
    assert [m.file_from_offset for m in q.mapped_files] == [2 * SIZE, 3 * SIZE]
    n = q.delete_expired_file_by_time(0, 0, 1000, True, 10, now_ms=0)
    assert n == 1
    assert [m.file_from_offset for m in q.mapped_files] == [3 * SIZE]
    q.shutdown(0)


def test_allocator_prepares_the_next_file(tmp_path: Path) -> None:
    alloc = MappedFileAllocator(warm=True)
    q = MappedFileQueue(tmp_path, SIZE, allocator=alloc)
    first = q.get_last_mapped_file()
    assert first is not None
    q.prepare_next_file()
    first.append(bytes(SIZE))
    second = q.get_last_mapped_file()
    assert second is not None and second.file_from_offset == SIZE
    assert second.warmed  # prepared in the background before it was needed
    second.append(b"x")
    q.prepare_next_file()
    q.shutdown(0)  # closes the allocator: a prepared, unused file is removed
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(0), file_name(SIZE)]


def test_interrupted_creation_leaves_no_short_file(tmp_path: Path) -> None:
    # what a crash between create and allocate leaves: only the temporary name
    (tmp_path / f".{file_name(SIZE)}.tmp").write_bytes(b"")
    q = MappedFileQueue(tmp_path, SIZE)
    q.get_last_mapped_file()
    q.shutdown(0)
    again = MappedFileQueue(tmp_path, SIZE)
    again.load()
    assert [m.file_from_offset for m in again.mapped_files] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [file_name(0)]
    again.shutdown(0)


def test_allocator_warms_only_the_first_window_of_the_next_file(tmp_path: Path) -> None:
    size = 16 * SIZE  # 16 pages; the window is 4 of them
    alloc = MappedFileAllocator(warm=True, flush_on_warm=True, warm_limit=size // 4)
    q = MappedFileQueue(tmp_path, size, allocator=alloc)
    first = q.get_last_mapped_file()
    assert first is not None
    q.prepare_next_file()
    first.append(bytes(size))
    second = q.get_last_mapped_file()
    assert second is not None and second.file_from_offset == size
    assert second.warmed_to == size // 4 and not second.warmed
    second.append(b"x")
    second.populate(size // 2, flush=True)  # the writer's warm-ahead carries on from there
    assert second.warmed_to == size // 2 and second.read(0, 1) == b"x"
    q.shutdown(0)
