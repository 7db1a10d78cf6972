"""Normal operation logs no ERROR: clients connect and go away (with a telemetry stream
open, with a long poll in flight), and the server stops cleanly with clients connected."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import reliable
from reliable import Message, Producer, SimpleConsumer, TransportError, Worker, handler
from tests.e2e.grpc.server_process import ServerProcess


def test_no_error_lines_across_connects_disconnects_and_shutdown(
    make_server: Callable[..., ServerProcess],
) -> None:
    server = make_server()
    seen: list[bytes] = []

    @handler("quiet", group="quiet-g", consume_from="first")
    def h(message: reliable.ReceivedMessage) -> None:
        seen.append(message.body)

    for round_ in range(2):  # a push consumer's telemetry stream opens and closes
        with (
            Worker(h, transport="grpc", endpoint=server.endpoint),
            Producer("grpc", endpoint=server.endpoint) as producer,
        ):
            producer.send(Message("quiet", f"m{round_}".encode()))
            deadline = time.monotonic() + 20
            while len(seen) <= round_ and time.monotonic() < deadline:
                time.sleep(0.05)
    assert sorted(seen) == [b"m0", b"m1"]

    # a client that goes away while its long poll waits
    transport = reliable.connect("grpc", endpoint=server.endpoint)
    transport.start()
    consumer = SimpleConsumer(
        "quiet-poll", {"quiet-empty": "*"}, transport=transport, await_duration_s=4
    )
    consumer.start()
    errors: list[BaseException] = []

    def poll() -> None:
        try:
            consumer.receive()
        except TransportError as exc:
            errors.append(exc)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1)
    transport.close()
    poller.join(10)
    assert errors, "the long poll should have ended with the channel"

    # and one still connected when the server stops
    staying = Worker(h, transport="grpc", endpoint=server.endpoint)
    staying.__enter__()
    try:
        time.sleep(1)
        assert server.terminate() == 0
    finally:
        # the server is gone: leaving the group cannot be said
        with contextlib.suppress(reliable.ReliableError):
            staying.__exit__(None, None, None)
    output = "".join(server.output)
    assert "stopped" in output, output
    assert " ERROR " not in output and "Task was destroyed" not in output, output
