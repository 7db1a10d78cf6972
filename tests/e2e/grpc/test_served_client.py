"""The framework against a served broker that is down, comes back, or is not up yet.

- a failed send names its cause, even when no attempt got past the route lookup;
- a producer sends again within about a second of the broker coming back;
- `reliable consume --endpoint` (the installed console script, run from the application's
  directory) waits for a broker that is not up yet, says so, and consumes once it is.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from protocol.ports import free_port
from reliable import Message, Producer, SendFailed, TransportError
from tests.e2e.grpc.server_process import REPO, ServerProcess
from tests.e2e.helpers import wait_until


def test_send_failed_names_its_cause() -> None:
    endpoint = f"127.0.0.1:{free_port()}"
    with Producer("grpc", endpoint=endpoint) as producer, pytest.raises(SendFailed) as caught:
        producer.send(Message("nowhere", b"x"))
    assert isinstance(caught.value.last_error, TransportError), caught.value
    assert "UNAVAILABLE" in str(caught.value) and endpoint in str(caught.value)
    assert not str(caught.value).endswith("None")


def test_producer_sends_within_a_second_of_the_broker_coming_back(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server()
    with Producer("grpc", endpoint=server.endpoint) as producer:
        producer.send(Message("comeback", b"before"))
        server.kill()
        down_until = time.monotonic() + 6  # long enough for gRPC's own backoff to reach 4 s
        while time.monotonic() < down_until:
            with pytest.raises(SendFailed):
                producer.send(Message("comeback", b"down"))
            time.sleep(0.2)
        server.start()
        back = time.monotonic()
        while True:
            try:
                producer.send(Message("comeback", b"after"))
                break
            except SendFailed:
                assert time.monotonic() - back < 5, "no send succeeded 5 s after restart"
                time.sleep(0.05)
        # gRPC's default reconnect backoff kept sends failing 4-6 s here; 2.5 s is generous
        assert time.monotonic() - back < 2.5


HANDLERS = """
import os
from reliable import handler

@handler("app-orders", group="app-g", consume_from="first")
def record(message):
    with open(os.environ["APP_OUT"], "a") as f:
        f.write(message.body.decode() + "\\n")
"""


def test_consume_waits_for_the_broker_and_imports_from_the_working_directory(
    tmp_path: Path, client_home: Path
) -> None:
    app = tmp_path / "app"
    (app / "myapp").mkdir(parents=True)
    (app / "myapp" / "__init__.py").write_text("")
    (app / "myapp" / "handlers.py").write_text(HANDLERS)
    out = tmp_path / "processed"
    port = free_port()
    script = Path(sys.executable).with_name("reliable")  # the installed console script
    assert script.exists()
    env = dict(os.environ, PYTHONPATH=str(REPO), APP_OUT=str(out), PYTHONUNBUFFERED="1")
    child = subprocess.Popen(
        [str(script), "consume", "myapp.handlers", "--endpoint", f"127.0.0.1:{port}"],
        cwd=app,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stderr: list[str] = []
    threading.Thread(target=lambda: stderr.extend(child.stderr or []), daemon=True).start()
    server = ServerProcess(tmp_path / "store", client_home, port=port)
    try:
        wait_until(
            lambda: sum("waiting for broker" in line for line in stderr) >= 2,
            timeout=20,
            what="the consumer waiting for the broker",
        )
        assert child.poll() is None, "".join(stderr)
        server.start()
        with Producer("grpc", endpoint=server.endpoint) as producer:
            for i in range(5):
                producer.send(Message("app-orders", f"order-{i}".encode()))
        wait_until(
            lambda: (
                out.exists() and sorted(out.read_text().split()) == [f"order-{i}" for i in range(5)]
            ),
            timeout=30,
            what="the 5 orders",
        )
        child.send_signal(signal.SIGTERM)
        stdout, _ = child.communicate(timeout=30)
        assert child.returncode == 0, "".join(stderr)
        # without -v, one line says what is consumed and from where
        assert stdout.strip().splitlines() == [
            f"reliable consume: consuming app-orders as app-g from broker 127.0.0.1:{port} (grpc)"
        ], stdout
    finally:
        if child.poll() is None:
            child.kill()
        server.kill()


def test_consume_refuses_a_handler_that_would_dead_letter_silently(tmp_path: Path) -> None:
    app = tmp_path / "app"
    app.mkdir()
    (app / "risky.py").write_text(
        "from reliable import handler\n\n"
        "@handler('risky-orders', group='risky-g', retry_on=(ConnectionError,))\n"
        "def h(message):\n    pass\n"
    )
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("reliable")),
            "consume",
            "risky",
            "--store",
            str(tmp_path / "store"),
        ],
        cwd=app,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "dead_letter_other=True" in done.stderr and "Traceback" not in done.stderr
