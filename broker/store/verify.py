"""Check every file of a stopped store and say exactly what is wrong where.

`verify_store(config, parsers)` reads the store read-only (nothing is repaired) and returns a
`VerifyReport`: one `Problem` per damage found, each naming the file, the byte offset in it
and what is wrong. `reliable admin store verify --store DIR` prints it.

What is checked:

- **commitlog/**: file names (20-digit offsets, contiguous, one size); every record in
  order: magic code, lengths, PHYSICALOFFSET equal to its position, checksum (version 2:
  the whole record; version 1: the body), topic and properties decodable; the blank record
  ending a file. After damage the scan resumes at the next valid record and says how many
  bytes it skipped. Non-zero bytes after the last record of the last file are a write cut
  short (the next start drops them).
- **consumequeue/**: every unit points at its record (queue_check.py: record start, size,
  queue id, queue offset, topic) and carries its tags code; units go forward; nothing
  follows the end. A queue the commitlog has records for but whose directory is missing.
- **index/**: file size against the configured geometry, header counts, every hash slot
  and entry link inside the file, every entry pointing at a valid record that has the key.
- **config files**: `consumequeue.json` and each `config/*.json` (and its `.bak`) parse as
  JSON objects of the shape their loader expects (`parsers`), `checkpoint` is intact.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import struct
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from broker.store.checkpoint import StoreCheckpoint
from broker.store.codec import (
    BLANK_MAGIC_CODE,
    FIXED_SIZE,
    HEADER_SIZE,
    RECORD_MAGIC_CODE,
    RECORD_MAGIC_CODES,
    _strict_properties,
    body_crc,
    check_message_and_return_size,
    is_queued,
    record_crc,
)
from broker.store.config import GEOMETRY_FILE, StoreConfig, with_store_geometry
from broker.store.consume_queue import (
    BLANK_UNIT_SIZE,
    CQ_STORE_UNIT_SIZE,
)
from broker.store.consume_queue_store import QUEUE_REGISTRY_NAME, ConsumeQueueStore
from broker.store.errors import ConfigShapeError, ForeignFile, StoreError
from broker.store.index_file import (
    HASH_SLOT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HEADER_SIZE,
    index_file_size,
)
from broker.store.index_key import topic_key_hash
from broker.store.queue_check import UnitChecker

Parse = Callable[[dict[str, Any]], object]
_PREFIX = struct.Struct(">ii")
_I32 = struct.Struct(">i")
_HEAD = struct.Struct(">iiiiiqqiq8sq8siqi")
_UNIT = struct.Struct(">qiq")
_INDEX_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_BLOCK = 256  # hash slots are checked this many bytes at a time
_ZERO_BLOCK = bytes(_BLOCK)
_MAX_PROBLEMS_PER_FILE = 20  # then one line says how many more


@dataclass(frozen=True, slots=True)
class Problem:
    """One damage: the file (relative to the store), the byte offset in it, what is wrong."""

    file: str
    offset: int
    problem: str

    def __str__(self) -> str:
        return f"{self.file} @{self.offset}: {self.problem}"


@dataclass(slots=True)
class VerifyReport:
    store: str
    problems: list[Problem] = field(default_factory=list)
    checked: dict[str, int] = field(
        default_factory=lambda: {
            "commitlog_files": 0,
            "records": 0,
            "queues": 0,
            "units": 0,
            "index_files": 0,
            "index_entries": 0,
            "config_files": 0,
        }
    )

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "ok": self.ok,
            "checked": dict(self.checked),
            "problems": [asdict(p) for p in self.problems],
        }


class _Problems:
    """Collects problems, at most `_MAX_PROBLEMS_PER_FILE` a file (then a count)."""

    def __init__(self, report: VerifyReport, root: Path) -> None:
        self.report = report
        self.root = root
        self._per_file: dict[str, int] = {}

    def add(self, path: Path, offset: int, problem: str) -> None:
        name = str(path.relative_to(self.root)) if path.is_relative_to(self.root) else str(path)
        n = self._per_file.get(name, 0) + 1
        self._per_file[name] = n
        if n <= _MAX_PROBLEMS_PER_FILE:
            self.report.problems.append(Problem(name, offset, problem))

    def close(self) -> None:
        for name, n in self._per_file.items():
            if n > _MAX_PROBLEMS_PER_FILE:
                self.report.problems.append(
                    Problem(name, -1, f"{n - _MAX_PROBLEMS_PER_FILE} more problems not listed")
                )


def _map(path: Path, stack: ExitStack) -> mmap.mmap | bytes:
    with path.open("rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return b""
        return stack.enter_context(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))


def _numbered_files(directory: Path, digits: int, out: _Problems) -> list[tuple[int, Path]]:
    files = []
    for path in sorted(directory.iterdir()):
        if path.name.startswith(".") and path.name.endswith(".tmp"):
            continue  # an allocation cut short: deleted at load
        if not path.is_file() or len(path.name) != digits or not path.name.isdigit():
            out.add(path, 0, f"not a store file (expected a file named by a {digits}-digit offset)")
            continue
        files.append((int(path.name), path))
    return files


def describe_record(buf: mmap.mmap | bytes, pos: int, phy: int) -> str:
    """Why the bytes at `pos` are not a valid record (check_message_and_return_size
    said -1)."""
    left = len(buf) - pos
    if left < 8:
        return f"{left} stray bytes where a record or blank record must be"
    total, magic = _PREFIX.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return f"blank record of {total} bytes does not fill the file ({left} left)"
    if magic not in RECORD_MAGIC_CODES:
        return f"no record here: magic code {magic & 0xFFFFFFFF:#010x}"
    if total < FIXED_SIZE or total > left:
        return f"TOTALSIZE {total} is outside [{FIXED_SIZE}, {left}]"
    head = _HEAD.unpack_from(buf, pos)
    crc, phy_field, blen = head[2], head[6], head[14]
    if phy_field != phy:
        return f"PHYSICALOFFSET {phy_field} is not the record's position {phy}"
    if blen < 0 or FIXED_SIZE + blen > total:
        return f"BODYLEN {blen} does not fit TOTALSIZE {total}"
    body_end = pos + HEADER_SIZE + blen
    tlen = buf[body_end]
    if tlen == 0 or FIXED_SIZE + blen + tlen > total:
        return f"TOPICLEN {tlen} does not fit the record"
    (plen,) = struct.unpack_from(">h", buf, body_end + 1 + tlen)
    if plen < 0 or FIXED_SIZE + blen + tlen + plen != total:
        return f"PROPERTIESLEN {plen}: lengths do not add up to TOTALSIZE {total}"
    if magic == RECORD_MAGIC_CODE:
        want = record_crc(buf, pos, total)
        if want != crc:
            return (
                f"fails its checksum (stored {crc:#010x}, computed {want:#010x}): "
                "some byte of the record changed"
            )
    elif body_crc(buf[pos + HEADER_SIZE : body_end]) != crc:
        return "body fails its CRC (version 1 record)"
    try:
        topic = str(buf[body_end + 1 : body_end + 1 + tlen], "utf-8")
        _strict_properties(buf[body_end + 3 + tlen : pos + total])
    except ValueError:
        return "topic or properties do not decode"
    if "\x00" in topic:
        return "topic holds NUL"
    return "invalid record"


_MAGICS = tuple(m.to_bytes(4, "big", signed=True) for m in RECORD_MAGIC_CODES)
_MAGIC_PREFIX = _MAGICS[0][:3]  # both versions' magic codes start DA A3 20


def _resync(buf: mmap.mmap | bytes, pos: int, base: int) -> int:
    """The first position after `pos` holding a valid record; -1 when none."""
    at = pos + 1
    while True:
        i = buf.find(_MAGIC_PREFIX, at + 4)  # MAGICCODE is 4 bytes into a record
        if i < 0:
            return -1
        start = i - 4
        if (
            buf[i : i + 4] in _MAGICS
            and check_message_and_return_size(buf, start, True, base + start)[0] > 0
        ):
            return start
        at = start + 1


class _Commitlog:
    """What the commitlog scan learned, for checking queues and the index."""

    def __init__(self) -> None:
        self.files: list[tuple[int, mmap.mmap | bytes]] = []
        self.min = -1
        self.end = 0
        self.queued: dict[tuple[str, int], int] = {}  # (topic, queue id) -> records

    def locate(self, phy: int) -> tuple[mmap.mmap | bytes, int] | None:
        for base, buf in reversed(self.files):
            if base <= phy < base + len(buf):
                return buf, base
        return None


def _scan_commitlog(
    root: Path, out: _Problems, report: VerifyReport, stack: ExitStack
) -> _Commitlog:
    cl = _Commitlog()
    directory = root / "commitlog"
    if not directory.is_dir():
        return cl
    files = _numbered_files(directory, 20, out)
    size = None
    for i, (base, path) in enumerate(files):
        buf = _map(path, stack)
        report.checked["commitlog_files"] += 1
        if size is None:
            size = len(buf)
        elif len(buf) != size:
            out.add(path, 0, f"file of {len(buf)} bytes, the others have {size}")
        if cl.files and cl.files[-1][0] + len(cl.files[-1][1]) != base:
            out.add(
                path,
                0,
                f"does not follow the previous file (ends at "
                f"{cl.files[-1][0] + len(cl.files[-1][1])})",
            )
        cl.files.append((base, buf))
        last = i == len(files) - 1
        pos = 0
        while pos < len(buf):
            n, req = check_message_and_return_size(buf, pos, True, base + pos)
            if n > 0:
                assert req is not None
                report.checked["records"] += 1
                if cl.min < 0:
                    cl.min = base + pos
                if is_queued(req.sys_flag):
                    key = (req.topic, req.queue_id)
                    cl.queued[key] = cl.queued.get(key, 0) + 1
                pos += n
                cl.end = base + pos
                continue
            if n == 0:
                cl.end = base + len(buf)
                break
            if last and not any(buf[pos:]):
                break  # never written: the end of the log
            nxt = _resync(buf, pos, base)
            if last and nxt < 0:
                out.add(
                    path,
                    pos,
                    f"{len(buf) - pos} bytes after the last record are not a "
                    "record (a write cut short: the next start drops them): "
                    + describe_record(buf, pos, base + pos),
                )
                break
            skipped = (nxt if nxt >= 0 else len(buf)) - pos
            out.add(
                path,
                pos,
                f"{describe_record(buf, pos, base + pos)}; {skipped} bytes "
                "up to the next valid record are lost",
            )
            if nxt < 0:
                break
            pos = nxt
    return cl


def _check_queues(
    root: Path,
    config: StoreConfig,
    cl: _Commitlog,
    out: _Problems,
    report: VerifyReport,
    stack: ExitStack,
) -> None:
    directory = root / "consumequeue"
    checker = UnitChecker(cl.locate, max(cl.min, 0), cl.end)
    seen: set[tuple[str, int]] = set()
    deleted: dict[str, int] = {}
    registry = root / QUEUE_REGISTRY_NAME
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
        # a bad registry is reported with the config files
        deleted = ConsumeQueueStore.parse_registry(json.loads(registry.read_bytes()))[1]
    for topic_dir in sorted(directory.iterdir()) if directory.is_dir() else ():
        if not topic_dir.is_dir():
            out.add(topic_dir, 0, "a file where a topic directory belongs")
            continue
        for queue_dir in sorted(topic_dir.iterdir()):
            if not queue_dir.is_dir() or not queue_dir.name.isdigit():
                out.add(queue_dir, 0, "not a queue-id directory")
                continue
            queue_id = int(queue_dir.name)
            seen.add((topic_dir.name, queue_id))
            report.checked["queues"] += 1
            _check_queue(topic_dir.name, queue_id, queue_dir, checker, cl, out, report, stack)
    for (topic, queue_id), n in sorted(cl.queued.items()):
        if (topic, queue_id) not in seen and topic not in deleted:
            out.add(
                directory / topic / str(queue_id),
                0,
                f"missing: the commitlog holds {n} records of this queue (the next "
                "start rebuilds it)",
            )


def _check_queue(
    topic: str,
    queue_id: int,
    directory: Path,
    checker: UnitChecker,
    cl: _Commitlog,
    out: _Problems,
    report: VerifyReport,
    stack: ExitStack,
) -> None:
    raw_topic = topic.encode()
    last_phy = -1
    ended: Path | None = None
    for base, path in _numbered_files(directory, 20, out):
        buf = _map(path, stack)
        if base % CQ_STORE_UNIT_SIZE or len(buf) % CQ_STORE_UNIT_SIZE:
            out.add(path, 0, f"size {len(buf)} or name is not a multiple of {CQ_STORE_UNIT_SIZE}")
            continue
        used = len(bytes(buf).rstrip(b"\0"))  # C speed: most of a file is never written
        used += -used % CQ_STORE_UNIT_SIZE
        if used and ended is not None:
            out.add(path, 0, "units after the queue's end (zeros before them)")
            continue
        for pos in range(0, used, CQ_STORE_UNIT_SIZE):
            phy, size, tags = _UNIT.unpack_from(buf, pos)
            if phy == 0 and size == 0 and tags == 0:
                ended = ended or path
                continue
            if ended is not None:
                out.add(path, pos, "a unit after the queue's end (zeros before it)")
                continue
            if size == BLANK_UNIT_SIZE:
                continue
            report.checked["units"] += 1
            index = (base + pos) // CQ_STORE_UNIT_SIZE
            if phy < last_phy:
                out.add(
                    path,
                    pos,
                    f"unit {index} points at {phy}, before the previous "
                    f"unit's record at {last_phy}",
                )
            last_phy = max(last_phy, phy)
            problem = checker.problem(raw_topic, queue_id, index, phy, size)
            if problem is None and phy >= checker.commitlog_min:
                problem = _tags_problem(cl, topic, phy, tags)
            if problem is not None:
                out.add(path, pos, f"unit {index} {problem}")
        if used < len(buf):
            ended = ended or path  # zeros from here on: the queue's end


def _tags_problem(cl: _Commitlog, topic: str, phy: int, tags: int) -> str | None:
    found = cl.locate(phy)
    if found is None:
        return None
    buf, base = found
    n, req = check_message_and_return_size(buf, phy - base, False, phy)
    if n <= 0 or req is None:
        return f"points at the record at {phy}, which is not valid"
    if req.tags_code != tags:
        return f"tags code {tags}, but the record's is {req.tags_code}"
    return None


def _check_index(
    root: Path,
    config: StoreConfig,
    cl: _Commitlog,
    out: _Problems,
    report: VerifyReport,
    stack: ExitStack,
) -> None:
    directory = root / "index"
    if not directory.is_dir():
        return
    slots_n, entries_n = config.max_hash_slot_num, config.max_index_num
    expected = index_file_size(slots_n, entries_n)
    for path in sorted(directory.iterdir()):
        if path.name.startswith("."):
            continue
        if not path.is_file() or len(path.name) != 17 or not path.name.isdigit():
            out.add(path, 0, "not an index file (expected a yyyyMMddHHmmssSSS name)")
            continue
        report.checked["index_files"] += 1
        buf = _map(path, stack)
        if len(buf) != expected:
            out.add(
                path,
                0,
                f"{len(buf)} bytes, not the configured geometry's {expected} "
                f"({slots_n} slots, {entries_n} entries)",
            )
            continue
        _, _, _, _end_phy, _used, count = _INDEX_HEADER.unpack_from(buf, 0)
        if not 0 <= count <= entries_n + 1:
            out.add(path, 36, f"index count {count} is outside [0, {entries_n + 1}]")
            continue
        entries_at = INDEX_HEADER_SIZE + slots_n * HASH_SLOT_SIZE
        limit = max(count, 1)
        for block in range(INDEX_HEADER_SIZE, entries_at, _BLOCK):
            raw = buf[block : min(block + _BLOCK, entries_at)]
            if raw == _ZERO_BLOCK[: len(raw)]:
                continue  # most slots are empty: skip them a block at a time
            for k, (slot,) in enumerate(_I32.iter_unpack(raw)):
                if slot and not 0 < slot < limit:
                    out.add(
                        path,
                        block + k * HASH_SLOT_SIZE,
                        f"hash slot points at entry {slot}, past the index count {count}",
                    )
        for n in range(1, max(count, 1)):
            at = entries_at + n * INDEX_ENTRY_SIZE
            key_hash, phy, _diff, previous = _ENTRY.unpack_from(buf, at)
            report.checked["index_entries"] += 1
            if not 0 <= previous < n:
                out.add(path, at, f"entry {n} links to entry {previous}, not an older one")
            problem = _entry_problem(cl, key_hash, phy)
            if problem is not None:
                out.add(path, at, f"entry {n} {problem}")


def _entry_problem(cl: _Commitlog, key_hash: int, phy: int) -> str | None:
    if phy < max(cl.min, 0):
        return None  # the record expired
    if phy >= cl.end:
        return f"points at {phy}, past the commitlog's end {cl.end}"
    found = cl.locate(phy)
    if found is None:
        return f"points at {phy}, in no commitlog file"
    buf, base = found
    n, req = check_message_and_return_size(buf, phy - base, False, phy)
    if n <= 0 or req is None:
        return f"points at {phy}, which is not the start of a valid record"
    keys = [k for k in req.keys.split(" ") if k]
    if req.uniq_key:
        keys.append(req.uniq_key)
    if key_hash not in {topic_key_hash(req.topic, k) for k in keys}:
        return f"key hash {key_hash} is not one of the record's at {phy}"
    return None


def _check_config_files(
    root: Path,
    config: StoreConfig,
    parsers: Mapping[str, Parse],
    out: _Problems,
    report: VerifyReport,
) -> None:
    files: list[tuple[Path, Parse | None]] = [
        (root / QUEUE_REGISTRY_NAME, ConsumeQueueStore.parse_registry)
    ]
    config_dir = config.config_dir
    if config_dir.is_dir():
        for path in sorted(config_dir.glob("*.json")):
            files.append((path, parsers.get(path.name)))
    for path, parse in files:
        for candidate in (path, path.with_name(path.name + ".bak")):
            if not candidate.is_file():
                continue
            report.checked["config_files"] += 1
            problem = _config_problem(candidate, parse)
            if problem is not None:
                backup = candidate.name.endswith(".bak")
                out.add(
                    candidate, 0, problem + ("" if backup else " (a start falls back to the .bak)")
                )
    try:
        cp = StoreCheckpoint.open(config.checkpoint_path)
    except StoreError as exc:
        out.add(config.checkpoint_path, 0, str(exc))
    else:
        if config.checkpoint_path.exists() and not cp.loaded:
            out.add(
                config.checkpoint_path,
                0,
                "torn (its CRC fails): the next start recovers as after a crash",
            )


def _config_problem(path: Path, parse: Parse | None) -> str | None:
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"not JSON ({exc})"
    if not isinstance(data, dict):
        return f"top level is {type(data).__name__}, not an object"
    if parse is not None:
        try:
            parse(data)
        except ConfigShapeError as exc:
            return f"wrong shape: {exc}"
        except Exception as exc:  # parse is pure: anything it raises is a bad shape
            return f"wrong shape: {type(exc).__name__}: {exc}"
    return None


def verify_store(config: StoreConfig, parsers: Mapping[str, Parse] | None = None) -> VerifyReport:
    """Check every file of the (stopped) store at `config.store_dir`; nothing is changed.

    `parsers` maps a `config/` file name to its loader's parse function (shape check).
    The store's own geometry (its `geometry.json`, or its files' sizes) wins over the
    configured one, as it does when the store is opened."""
    root = config.store_dir
    report = VerifyReport(str(root))
    out = _Problems(report, root)
    try:
        config = with_store_geometry(config)
    except ForeignFile as exc:
        out.add(root / GEOMETRY_FILE, 0, str(exc))
    with ExitStack() as stack:
        cl = _scan_commitlog(root, out, report, stack)
        _check_queues(root, config, cl, out, report, stack)
        _check_index(root, config, cl, out, report, stack)
        cl.files.clear()
    _check_config_files(root, config, parsers or {}, out, report)
    out.close()
    return report


def iter_lines(report: VerifyReport) -> Iterator[str]:
    """The report as text: one line per problem, then a summary."""
    for problem in report.problems:
        yield str(problem)
    checked = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in report.checked.items())
    verdict = "OK" if report.ok else f"{len(report.problems)} problems"
    yield f"{report.store}: {verdict} (checked {checked})"


__all__ = ["Problem", "VerifyReport", "describe_record", "iter_lines", "verify_store"]
