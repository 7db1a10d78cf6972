"""`reliable broker start` on a store whose files are damaged: it recovers from what is
derived or backed up, and otherwise refuses with one line naming the file and the problem."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.grpc.server_process import REPO, TEST_STORE, ServerProcess

# (file, a valid JSON document of the wrong shape, what the refusal names)
WRONG_SHAPES = [
    ("consumerOffset.json", {"offsetTable": []}, "offsetTable: expected an object, got a list"),
    ("consumerOffset.json", {"offsetTable": {"T@g": {"0": "x"}}}, "offsetTable.T@g.0"),
    ("topics.json", {"topicConfigTable": {"T": []}}, "topicConfigTable.T: expected an object"),
    ("topics.json", {"topicConfigTable": {"T": {"topicName": "T"}}}, "no readQueueNums"),
    (
        "subscriptionGroup.json",
        {"subscriptionGroupTable": 7},
        "subscriptionGroupTable: expected an object, got an integer",
    ),
    ("delayOffset.json", {"offsetTable": {"1": 5}, "timer": []}, "timer: expected an object"),
    ("delayOffset.json", {"recalled": [[1]]}, "recalled[]"),
    ("popState.json", {"groups": {"g": {"T": {"0": {"low": 0}}}}}, "groups.g.T.0.next"),
    ("popState.json", {"groups": []}, "groups: expected an object"),
    (
        "popState.json",
        {"groups": {"g": {"T": {"0": {"low": 0, "next": 10, "done": [[5, 99]]}}}}},
        "outside the window",
    ),
    ("../consumequeue.json", {"queues": {"T": [0, -1]}}, "queues.T[]: -1 is below 0"),
]


def start(store: Path, home: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HOME=str(home))
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "reliable_cli",
            "broker",
            "start",
            "--store",
            str(store),
            "--port",
            "0",
            *TEST_STORE,
        ],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("name", "document", "says"),
    WRONG_SHAPES,
    ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(WRONG_SHAPES)],
)
def test_a_config_file_of_the_wrong_shape_refuses_the_start_in_one_line(
    tmp_path: Path, name: str, document: object, says: str
) -> None:
    store = tmp_path / "store"
    (store / "config").mkdir(parents=True)
    (store / "config" / name).write_text(json.dumps(document))
    done = start(store, tmp_path)
    assert done.returncode != 0
    assert "Traceback" not in done.stderr + done.stdout
    problem = [line for line in done.stderr.splitlines() if "cannot start" in line]
    assert len(problem) == 1, done.stderr
    assert Path(name).name in problem[0] and says in problem[0], problem[0]
    assert not (store / "abort").exists(), "a refused start must not leave the abort file"


def test_a_config_file_of_the_wrong_shape_falls_back_to_its_backup(tmp_path: Path) -> None:
    store = tmp_path / "store"
    config = store / "config"
    config.mkdir(parents=True)
    good = {"offsetTable": {"T@g": {"0": 7}}}
    (config / "consumerOffset.json").write_text(json.dumps({"offsetTable": []}))
    (config / "consumerOffset.json.bak").write_text(json.dumps(good))
    server = ServerProcess(store, tmp_path).start()
    try:
        assert server.alive()
    finally:
        assert server.terminate() == 0
    out = "".join(server.output)
    assert "Traceback" not in out
    assert "consumerOffset.json" in out and "backup" in out
    saved = json.loads((config / "consumerOffset.json").read_text())
    assert saved["offsetTable"]["T@g"] == {"0": 7}
    assert not (store / "abort").exists()
