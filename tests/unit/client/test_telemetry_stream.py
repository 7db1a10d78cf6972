"""The grpc transport's Telemetry stream (`_grpc_telemetry.TelemetryStream`) against a
scripted stub: the Settings a server sees last are the client's latest.

A producer notes a topic (and resends its Settings) while one of its streams is opening;
when the stream's opening Settings, made before the topic was noted, left after the resend,
that server kept a producer that publishes nothing, its orphaned-transaction checks found
no one to ask, and its half messages were rolled back (tests/e2e/grpc/
test_cluster_framework.py). The interleaving is forced here, not waited for."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from reliable.transport._grpc_telemetry import TelemetryStream
from reliable.transport._pb import definition_pb2, service_pb2


class _Call:
    """One Telemetry call: reads every request the stream sends, answers each Settings."""

    def __init__(self, requests: Iterator[Any], sent: list[list[str]]) -> None:
        self._requests = requests
        self._sent = sent
        self._cancelled = threading.Event()

    def __iter__(self) -> _Call:
        return self

    def __next__(self) -> Any:
        request = next(self._requests)  # StopIteration when the stream closes
        self._sent.append([t.name for t in request.settings.publishing.topics])
        reply = service_pb2.TelemetryCommand()
        reply.status.code = definition_pb2.Code.OK
        reply.settings.CopyFrom(request.settings)
        return reply

    def cancel(self) -> None:
        self._cancelled.set()


class _Stub:
    def __init__(self) -> None:
        self.sent: list[list[str]] = []

    def Telemetry(self, requests: Iterator[Any], metadata: Any = None) -> _Call:
        return _Call(requests, self.sent)


class _Host:
    def __init__(self) -> None:
        self.stub = _Stub()

    def metadata(self, client_id: str) -> list[tuple[str, str]]:
        return [("x-mq-client-id", client_id)]


def test_settings_made_before_a_change_never_leave_after_it() -> None:
    host = _Host()
    published: list[str] = []
    opening_made = threading.Event()
    let_go = threading.Event()

    def settings() -> Any:
        made = definition_pb2.Settings()
        for topic in published:
            made.publishing.topics.add().name = topic
        if threading.current_thread().name.startswith("telemetry-") and not opening_made.is_set():
            opening_made.set()  # the stream's opening Settings, made with no topic yet...
            let_go.wait(5)  # ...held here until the topic is noted and its resend is under way
        return made

    stream = TelemetryStream(host, "unit@producer", settings, lambda command: None)
    try:
        assert opening_made.wait(5)
        published.append("t-orders")  # the producer notes a topic, then resends
        resend = threading.Thread(target=stream.resend_settings)
        resend.start()
        resend.join(0.3)  # queued by now unless it waits for the opening to be queued first
        let_go.set()
        resend.join(5)
        assert not resend.is_alive()
        assert stream.ready.wait(5)
        pause = threading.Event()
        for _ in range(100):  # the stream thread sends what is queued
            if len(host.stub.sent) >= 2:
                break
            pause.wait(0.05)
        # the server's last word is the latest Settings: the topic is there
        assert host.stub.sent == [[], ["t-orders"]]
    finally:
        let_go.set()
        stream.close()
