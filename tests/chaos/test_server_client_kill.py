"""A push consumer killed with SIGKILL while it holds a message: the server notices its
telemetry stream is gone and releases the message (it stops renewing it), so another
consumer of the group gets it within seconds instead of after the lease runs out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import REPO, ServerProcess

FAST = (
    "--min-invisible-ms",
    "1000",
    "--min-long-polling-ms",
    "1000",
    "--long-polling-ms",
    "5000",
    "--default-invisible-ms",
    "30000",
)

CHILD = textwrap.dedent("""
    import sys, threading
    from rocketmq import FilterExpression, MessageListener, PushConsumer
    from tests.e2e.grpc import official

    class Hold(MessageListener):
        def consume(self, message):
            print("got", message.message_id, flush=True)
            threading.Event().wait()  # never finishes

    c = PushConsumer(official.configuration(sys.argv[1]), "g-ck", Hold(),
                     {"t-ck": FilterExpression("*")})
    c.startup()
    print("ready", flush=True)
    threading.Event().wait()
""")


@pytest.mark.chaos
def test_killed_push_consumer_releases_its_message(tmp_path: Path, client_home: Path) -> None:
    server = ServerProcess(tmp_path / "store", client_home, *FAST).start()
    env = dict(os.environ, HOME=str(client_home), PYTHONPATH=str(REPO))
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, server.endpoint],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(child.stdout or []), daemon=True).start()
    try:
        assert official.wait_for(lambda: "ready\n" in lines, timeout_s=30)
        producer = official.producer(server.endpoint, ["t-ck"])
        mid = producer.send(official.message("t-ck", b"held")).message_id
        producer.shutdown()
        assert official.wait_for(lambda: f"got {mid}\n" in lines, timeout_s=30)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        consumer = official.simple_consumer(server.endpoint, "g-ck", "t-ck")
        try:
            # well before the 30 s lease would run out on its own
            got = official.receive_until(consumer, lambda g: len(g) >= 1, timeout_s=15)
        finally:
            consumer.shutdown()
        assert [(m.message_id, m.delivery_attempt) for m in got] == [(mid, 2)]
    finally:
        if child.poll() is None:
            child.kill()
        server.kill()
