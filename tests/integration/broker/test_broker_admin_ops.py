"""The broker side of dead-letter replay, offset reset and group deletion (`broker.admin`):
the replay ledger across restarts and a torn audit line, an offset reset that takes effect
for invisible-time receivers and survives a restart, the last consume time, and a deleted
group's windows forgotten."""

from __future__ import annotations

import pytest
from broker_kit import BrokerFactory, ManualClock, msg, settle

from broker.admin import methods
from broker.admin.dlq import AUDIT_FILE
from broker.admin.groups import GroupHasConsumers
from broker.broker import Broker
from broker.errors import InvalidReceiptHandle, SystemTopicReserved


def _dead(broker: Broker, n: int) -> list[str]:
    """`n` messages of topic t that group g dead-lettered."""
    broker.create_topic("t", queues=2)
    broker.create_group("g", retry_max_times=0)
    ids = [broker.send_message(msg("t", queue_id=i % 2)).msg_id for i in range(n)]
    settle(broker)
    for entry in broker.receive("g", "t", 32, invisible_ms=5_000):
        broker.forward_to_dlq("g", "t", entry.receipt_handle)
    settle(broker)
    return ids


def test_a_replayed_dead_letter_is_never_replayed_again_even_after_a_restart(
    make_broker: BrokerFactory,
) -> None:
    broker = make_broker()
    ids = _dead(broker, 4)
    ops = methods(broker)
    listed = ops["ListDeadLetters"]({"group": "g", "limit": 10})
    assert sorted(m["msg_id"] for m in listed["messages"]) == sorted(ids)
    first = ops["ReplayDeadLetters"](
        {"group": "g", "offsets": [0, 1], "operator": "me", "run": "r1"}
    )
    assert [r["dlq_offset"] for r in first["replayed"]] == [0, 1]
    settle(broker)
    copies = broker.store.get_max_offset_in_queue("%RETRY%g", 0)
    assert copies == 2
    copy = broker.store.get_message_by_queue_offset("%RETRY%g", 0, 0)
    assert copy is not None and copy.reconsume_times == 0
    assert copy.msg_id == first["replayed"][0]["msg_id"]  # the client message id is kept
    assert copy.properties["DLQ_REPLAY_OFFSET"] == "0"
    assert copy.properties["OPERATOR"] == "me"
    broker.shutdown()
    # a crash while a line was being appended leaves a torn last line: it is ignored
    audit = broker.store.config.config_dir / AUDIT_FILE
    with audit.open("ab") as f:
        f.write(b'{"group": "g", "replayed": [{"dlq_off')
    again = make_broker()
    ops = methods(again)
    second = ops["ReplayDeadLetters"](
        {"group": "g", "offsets": [0, 1, 2, 3], "operator": "you", "run": "r2"}
    )
    assert [r["dlq_offset"] for r in second["replayed"]] == [2, 3]
    assert [s["dlq_offset"] for s in second["skipped"]] == [0, 1]
    assert "already replayed" in second["skipped"][0]["reason"]
    settle(again)
    assert again.store.get_max_offset_in_queue("%RETRY%g", 0) == 4
    runs = [e["run"] for e in ops["DeadLetterAudit"]({"group": "g"})["entries"]]
    assert runs == ["r2", "r1"]
    pending = ops["ListDeadLetters"]({"group": "g", "pending_only": True})
    assert pending["messages"] == [] and pending["pending"] == 0


def test_reset_moves_an_invisible_time_group_back_and_survives_a_restart(
    make_broker: BrokerFactory, clock: ManualClock
) -> None:
    broker = make_broker()
    broker.create_topic("t", queues=1)
    broker.create_group("g")
    sent = [broker.send_message(msg("t")).msg_id for _ in range(6)]
    settle(broker)
    got = broker.receive("g", "t", 10, invisible_ms=60_000)
    assert len(got) == 6
    clock.advance(7)
    broker.ack_batch("g", "t", [e.receipt_handle for e in got[:4]])
    assert broker.query_offset("g", "t", 0) == 4
    ops = methods(broker)
    shown = ops["GroupProgress"]({"group": "g"})
    [queue] = shown["topics"][0]["queues"]
    assert (
        queue["committed_offset"],
        queue["lag"],
        queue["in_flight"],
        queue["last_consume_time_ms"],
    ) == (4, 2, 2, clock())
    plan = ops["ResetGroupOffset"]({"group": "g", "topic": "t", "to": "offset", "offset": 1})
    assert plan["executed"] is False and broker.query_offset("g", "t", 0) == 4
    done = ops["ResetGroupOffset"](
        {"group": "g", "topic": "t", "to": "offset", "offset": 1, "execute": True}
    )
    assert [(q["before"], q["after"]) for q in done["queues"]] == [(4, 1)]
    assert broker.in_flight("g", "t") == []  # the old leases no longer count
    with pytest.raises(InvalidReceiptHandle):  # a handle from before the reset is refused
        broker.ack("g", "t", got[4].receipt_handle)
    assert broker.query_offset("g", "t", 0) == 1
    broker.shutdown()
    again = make_broker()  # the reset is in the revive log: replayed at start-up
    assert again.query_offset("g", "t", 0) == 1
    redelivered = again.receive("g", "t", 10, invisible_ms=60_000)
    assert [e.message.msg_id for e in redelivered] == sent[1:]
    assert (
        methods(again)["GroupProgress"]({"group": "g"})["total"]["last_consume_time_ms"] == clock()
    )


def test_group_delete_forgets_offsets_and_windows_topic_delete_refuses_system_topics(
    broker: Broker,
) -> None:
    _dead(broker, 2)
    broker.heartbeat("c1", "g", {"t": None})
    ops = methods(broker)
    with pytest.raises(GroupHasConsumers):
        ops["DeleteGroup"]({"group": "g"})
    done = ops["DeleteGroup"]({"group": "g", "force": True})
    assert done["offsets_removed_on"] == ["t"]
    assert broker.get_group("g") is None and broker.offsets_of("g", "t") == {}
    assert broker.in_flight("g", "t") == []
    broker.create_group("g")  # a new group of the same name starts afresh
    assert len(broker.receive("g", "t", 10, invisible_ms=5_000)) == 2
    deleted = ops["DeleteTopic"]({"topic": "t"})
    assert deleted["deleted"] is True and broker.get_topic("t") is None
    for system in ("SCHEDULE_TOPIC_XXXX", "rmq_sys_REVIVE_LOG"):
        with pytest.raises(SystemTopicReserved):
            ops["DeleteTopic"]({"topic": system})
