"""Every program in examples/ runs to completion (exit 0) on a fresh store."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PROGRAMS = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
NEEDS = {"idempotent_handler.py": [pytest.mark.redis]}  # real services an example uses


def test_there_is_an_example_per_feature() -> None:
    assert {
        "handlers.py",
        "producer_modes.py",
        "ordered_messages.py",
        "delayed_messages.py",
        "transactional_send.py",
        "simple_consumer.py",
        "push_consumer.py",
        "idempotent_handler.py",
    } <= set(PROGRAMS)


@pytest.mark.parametrize("program", [pytest.param(p, marks=NEEDS.get(p, [])) for p in PROGRAMS])
def test_example_runs(program: str, tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(EXAMPLES.parent))
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / program), str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"{program} failed:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{program} printed nothing"


README = EXAMPLES.parent / "README.md"


def _block(text: str, after: str, lang: str = "") -> str:
    """The first fenced block (```lang) after the heading `after`."""
    return text.split(after, 1)[1].split(f"```{lang}\n", 1)[1].split("```", 1)[0]


def test_the_readme_served_broker_commands_serve_the_readme_example(tmp_path: Path) -> None:
    """The served-broker section's commands, run against a server that creates no topic by
    itself, create every topic the handler example sends to with a type that takes what
    it sends: the example's sends all succeed over gRPC."""
    from reliable import Message, Producer, ReliableError, SendStatus
    from tests.e2e.grpc.server_process import ServerProcess, cli

    text = README.read_text()
    commands = [
        shlex.split(line)
        for line in _block(text, "## The broker as a RocketMQ 5 server").splitlines()
        if line.strip()
    ]
    assert commands[0][:3] == ["reliable", "broker", "start"]
    sends = re.findall(
        r"producer\.send\((Message\(.*\))\)",
        _block(text, "## Producer, consumers and handler decorators", "python"),
    )
    assert len(sends) == 3
    server = ServerProcess(tmp_path / "store", tmp_path, "--no-auto-create-topics").start()
    try:
        for command in commands[1:]:
            assert command[0] == "reliable"
            args = command[1:]
            args[args.index("--endpoint") + 1] = server.endpoint
            done = cli(*args)
            assert done.returncode == 0, (command, done.stderr)
        with Producer("grpc", endpoint=server.endpoint) as producer:
            for expression in sends:
                message = eval(expression, {"Message": Message})
                assert producer.send(message).status is SendStatus.SEND_OK, expression
            # the test has teeth: a plain message to the FIFO topic is refused
            with pytest.raises(ReliableError):
                producer.send(Message("order-status", b"plain"))
    finally:
        assert server.terminate() == 0
