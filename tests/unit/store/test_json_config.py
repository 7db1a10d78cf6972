"""Atomic JSON config files: temp -> fsync -> rename, `.bak` fallback, clear errors."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.store.errors import ConfigFileError, StoreError
from broker.store.json_config import JsonConfigFile


def test_missing_file_loads_as_none(tmp_path: Path) -> None:
    assert JsonConfigFile(tmp_path / "topics.json").load() is None


def test_round_trip_and_backup_keeps_previous_version(tmp_path: Path) -> None:
    cfg = JsonConfigFile(tmp_path / "config" / "consumerOffset.json")
    cfg.save({"offsetTable": {"t@g": {"0": 1}}})
    assert cfg.load() == {"offsetTable": {"t@g": {"0": 1}}}
    assert not cfg.backup_path.exists()  # nothing to back up on the first save
    cfg.save({"offsetTable": {"t@g": {"0": 2}}})
    assert cfg.load() == {"offsetTable": {"t@g": {"0": 2}}}
    assert json.loads(cfg.backup_path.read_text()) == {"offsetTable": {"t@g": {"0": 1}}}
    # no temporary files are left next to it
    assert sorted(p.name for p in cfg.path.parent.iterdir()) == [
        "consumerOffset.json",
        "consumerOffset.json.bak",
    ]


@pytest.mark.parametrize("keep", [0, 1, 7])
def test_truncated_file_on_disk_falls_back_to_backup(tmp_path: Path, keep: int) -> None:
    cfg = JsonConfigFile(tmp_path / "topics.json")
    cfg.save({"topics": {"a": 4}})
    cfg.save({"topics": {"a": 4, "b": 8}})
    with open(cfg.path, "r+b") as f:  # a torn write: the real file cut short
        f.truncate(keep)
    assert cfg.load() == {"topics": {"a": 4}}


def test_garbage_or_non_object_falls_back_to_backup(tmp_path: Path) -> None:
    cfg = JsonConfigFile(tmp_path / "delayOffset.json")
    cfg.save({"offsetTable": {"1": 5}})
    cfg.save({"offsetTable": {"1": 6}})
    cfg.path.write_bytes(b"\xff\xfe\x00garbage")
    assert cfg.load() == {"offsetTable": {"1": 5}}
    cfg.path.write_text("[1, 2, 3]")
    assert cfg.load() == {"offsetTable": {"1": 5}}


def test_missing_main_file_uses_backup(tmp_path: Path) -> None:
    cfg = JsonConfigFile(tmp_path / "topics.json")
    cfg.save({"v": 1})
    cfg.save({"v": 2})
    cfg.path.unlink()  # e.g. a crash between two renames of an older writer
    assert cfg.load() == {"v": 1}


def test_both_corrupt_raises_clear_error(tmp_path: Path) -> None:
    cfg = JsonConfigFile(tmp_path / "subscriptionGroup.json")
    cfg.save({"v": 1})
    cfg.save({"v": 2})
    cfg.path.write_text('{"v": ')
    cfg.backup_path.write_text("")
    with pytest.raises(ConfigFileError) as info:
        cfg.load()
    assert isinstance(info.value, StoreError)
    assert info.value.path == cfg.path
    assert "backup" in str(info.value)


def test_corrupt_without_backup_raises(tmp_path: Path) -> None:
    cfg = JsonConfigFile(tmp_path / "topics.json")
    cfg.path.write_text("{not json")
    with pytest.raises(ConfigFileError, match="no backup"):
        cfg.load()


def test_save_over_corrupt_file_keeps_good_backup(tmp_path: Path) -> None:
    cfg = JsonConfigFile(tmp_path / "topics.json")
    cfg.save({"v": 1})
    cfg.save({"v": 2})
    cfg.path.write_text("{broken")
    cfg.save({"v": 3})
    assert cfg.load() == {"v": 3}
    assert json.loads(cfg.backup_path.read_text()) == {"v": 1}


def test_unencodable_data_raises_and_loses_nothing(tmp_path: Path) -> None:
    cfg = JsonConfigFile(tmp_path / "topics.json")
    cfg.save({"v": 1})
    with pytest.raises(ConfigFileError, match="JSON"):
        cfg.save({"v": object()})
    assert cfg.load() == {"v": 1}
    assert not cfg.backup_path.exists()


_WRITER = """
import sys
from pathlib import Path
from broker.store.json_config import JsonConfigFile
cfg = JsonConfigFile(Path(sys.argv[1]))
i = 0
while True:
    i += 1
    cfg.save({"counter": i, "pad": "x" * 4096})
    sys.stdout.write(f"{i}\\n")
    sys.stdout.flush()
"""


@pytest.mark.chaos
def test_kill_during_saves_always_leaves_a_loadable_acknowledged_version(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    path = tmp_path / "consumerOffset.json"
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout is not None
        acked = 0
        target = rng.randint(5, 60)
        deadline = time.monotonic() + 30
        while acked < target and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            acked = int(line)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert acked >= target
        data = JsonConfigFile(path).load()
        assert data is not None
        # the last acknowledged save (or a later one in flight) is what we read back
        assert data["counter"] >= acked
    # the next save clears whatever temp file a killed writer left behind
    JsonConfigFile(path).save({"counter": -1})
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "consumerOffset.json",
        "consumerOffset.json.bak",
    ]
