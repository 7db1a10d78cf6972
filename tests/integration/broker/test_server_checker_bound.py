"""The server's orphan-check registry is bounded by the topics that exist, not by the topic
names producers declare in their Settings (a real broker on real files, the server's
handlers driven in-process)."""

from __future__ import annotations

import asyncio

from broker.broker import Broker
from broker.server.clients import ClientHandlers
from broker.server.config import ServerConfig
from broker.server.context import CallInfo, ServerContext
from broker.server.sessions import ClientSession
from protocol.pb import definition_pb2


def _publishing(topics: list[str]) -> definition_pb2.Settings:
    settings = definition_pb2.Settings(client_type=definition_pb2.PRODUCER)
    for name in topics:
        settings.publishing.topics.add().name = name
    return settings


def test_declared_topics_that_do_not_exist_register_no_checker(broker: Broker) -> None:
    broker.create_topic("tx-real", message_type="TRANSACTION")
    ctx = ServerContext(broker, ServerConfig(port=0))
    handlers = ClientHandlers(ctx)
    registry = broker._tx._checkers  # the broker's checker registry, by producer group

    async def declare(topics: list[str], client: str) -> None:
        session = ClientSession(client, 0)
        await handlers._apply_settings(session, _publishing(topics), CallInfo(client, "", "r", {}))

    async def run() -> None:
        for round_ in range(20):  # 20 producers, 500 fresh names each
            await declare([f"nx-{round_}-{i}" for i in range(500)] + ["tx-real"], f"c{round_}")
        assert set(registry) == {"tx-real"}
        # a topic created later (as a transactional send auto-creates it) is watched from
        # its first transactional send on, and only once
        broker.create_topic("tx-later", message_type="TRANSACTION")
        handlers.watch_transactions("tx-later")
        first = registry["tx-later"]
        handlers.watch_transactions("tx-later")
        await declare(["tx-later"], "c-late")
        assert registry["tx-later"] is first
        assert set(registry) == {"tx-real", "tx-later"}

    try:
        asyncio.run(run())
    finally:
        ctx.pool.shutdown(wait=True)
