"""A client's Telemetry stream at the protocol level, for tests that need what no client
library does: a stream that reads every command and answers none, or two streams of one
client id. It opens with the Settings it is given and keeps every command, in order."""

from __future__ import annotations

import queue
import threading
from typing import Any

import grpc

from reliable.transport._pb import definition_pb2, service_pb2, service_pb2_grpc

PRODUCER, SIMPLE_CONSUMER = 1, 3  # the protocol's client types


def producer_settings(*topics: str) -> Any:
    settings = definition_pb2.Settings()
    settings.client_type = PRODUCER
    for topic in topics:
        settings.publishing.topics.add().name = topic
    return settings


def consumer_settings(group: str, topic: str) -> Any:
    settings = definition_pb2.Settings()
    settings.client_type = SIMPLE_CONSUMER
    settings.subscription.group.name = group
    entry = settings.subscription.subscriptions.add()
    entry.topic.name, entry.expression.type, entry.expression.expression = topic, 1, "*"
    return settings


class RawTelemetry:
    """One Telemetry call of `client_id` to `endpoint`, opened with `settings`."""

    def __init__(self, endpoint: str, client_id: str, settings: Any) -> None:
        self.channel = grpc.insecure_channel(endpoint)
        stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.outbox: queue.Queue[Any] = queue.Queue()
        opening = service_pb2.TelemetryCommand()
        opening.settings.CopyFrom(settings)
        self.outbox.put(opening)
        self.ready = threading.Event()  # the server answered the Settings
        self.commands: list[Any] = []
        self.call = stub.Telemetry(
            iter(self.outbox.get, None), metadata=[("x-mq-client-id", client_id)], timeout=120
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for command in self.call:
                if command.WhichOneof("command") == "settings":
                    self.ready.set()
                self.commands.append(command)
        except grpc.RpcError:
            pass

    def received(self, kind: str) -> list[Any]:
        """The commands of one kind received so far (e.g. `verify_message_command`)."""
        return [getattr(c, kind) for c in list(self.commands) if c.WhichOneof("command") == kind]

    def close(self) -> None:
        self.outbox.put(None)
        self.call.cancel()
        self.channel.close()
