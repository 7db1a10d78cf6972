"""Topic, group and offset tables persisted through the store's atomic JSON files."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.consumers import ConsumerRegistry
from broker.errors import InvalidArgument
from broker.offsets import ConsumerOffsetManager
from broker.store.json_config import JsonConfigFile
from broker.subscription import SubscriptionGroupConfig, SubscriptionGroupManager
from broker.topic import TopicConfig, TopicConfigManager, TopicMessageType


def test_topics_survive_a_reload(tmp_path: Path) -> None:
    file = JsonConfigFile(tmp_path / "topics.json")
    mgr = TopicConfigManager(file)
    mgr.put(TopicConfig("orders", 8, 8, 6, TopicMessageType.FIFO, order=True))
    mgr.get_or_create(TopicConfig("orders", 1, 1))  # never overwrites
    mgr.put(TopicConfig("audit", 2, 2, 4))
    again = TopicConfigManager(file)
    again.load()
    assert [c.name for c in again.all()] == ["audit", "orders"]
    orders = again.get("orders")
    assert orders is not None and orders.read_queue_nums == 8 and orders.order
    assert again.delete("audit") and not again.delete("audit")


def test_groups_survive_a_reload(tmp_path: Path) -> None:
    file = JsonConfigFile(tmp_path / "subscriptionGroup.json")
    mgr = SubscriptionGroupManager(file)
    mgr.put(SubscriptionGroupConfig("g1", retry_max_times=3, fifo=True))
    again = SubscriptionGroupManager(file)
    again.load()
    cfg = again.get("g1")
    assert cfg == SubscriptionGroupConfig("g1", retry_max_times=3, fifo=True)
    assert cfg is not None and cfg.max_delivery_attempts == 4
    assert SubscriptionGroupConfig("g2").retry_max_times == 16
    assert SubscriptionGroupConfig("g2").retry_queue_nums == 1


@pytest.mark.parametrize("kwargs", [{"retry_max_times": -1}, {"retry_queue_nums": 0}])
def test_bad_group_settings(kwargs: dict[str, int]) -> None:
    with pytest.raises(InvalidArgument):
        SubscriptionGroupConfig("g", **kwargs)  # type: ignore[arg-type]


def test_offsets_persist_only_when_dirty(tmp_path: Path) -> None:
    file = JsonConfigFile(tmp_path / "consumerOffset.json")
    mgr = ConsumerOffsetManager(file)
    assert mgr.query("g", "t", 0) == -1
    mgr.commit("g", "t", 0, 5)
    mgr.commit("g", "t", 3, 7)
    mgr.commit("h", "t", 0, 1)
    assert mgr.persist() is True
    assert mgr.persist() is False  # nothing changed
    data = file.load()
    assert data == {"offsetTable": {"t@g": {"0": 5, "3": 7}, "t@h": {"0": 1}}}
    again = ConsumerOffsetManager(file)
    again.load()
    assert again.query("g", "t", 3) == 7
    with pytest.raises(InvalidArgument):
        again.commit("g", "t", 0, -2)


def test_consumer_registry_expiry() -> None:
    now = [1_000]
    reg = ConsumerRegistry(lambda: now[0], expiry_ms=100)
    assert reg.heartbeat("c2", "g", {"t": None}) is True
    assert reg.heartbeat("c1", "g", {"t": ["a", "b"]}) is True
    assert reg.heartbeat("c1", "g", {"t": ["a"]}) is False
    assert reg.consumer_ids("g") == ["c1", "c2"]
    now[0] += 60
    reg.heartbeat("c1", "g", {"t": None})
    now[0] += 60  # c2 is now 120 ms silent
    assert reg.consumer_ids("g") == ["c1"]
    assert reg.scan_expired() == [("g", "c2")]
    assert reg.unregister("c1", "g") is True
    assert reg.consumer_ids("g") == []
