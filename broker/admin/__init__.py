"""Operator operations on a `Broker`, one module per noun: what `reliable admin` runs.

`broker.server.admin` is the protocol adapter (JSON bodies over the admin gRPC service);
the operations themselves live here, split by what they act on, because they are broker
logic that the CLI's `--store` mode runs on a stopped store exactly as the server runs
them, and because each noun (messages, topics; dead letters and groups later) grows its
own set of queries and actions:

    messages   query (by id, key, unique key, queue offset, time), send, reconsume
    trace      every record and consumer-group state of one business message
    topics     per-queue status (min/max offset, last store time)
    dlq        dead letters: list, replay (audited, idempotent), the replay audit
    groups     group progress, offset reset, group and topic deletion
    store      disk use against the watermarks, commitlog size

Each operation takes a JSON-shaped `dict` of parameters and returns a JSON-shaped `dict`;
arguments are checked here (`InvalidArgument`, a protocol BAD_REQUEST) and a message that
is not there is `MessageNotFound` (MESSAGE_NOT_FOUND). `methods(broker)` is the table the
admin service merges into its own.
"""

from __future__ import annotations

from collections.abc import Callable

from broker.broker import Broker
from protocol.admin import Params


def methods(broker: Broker) -> dict[str, Callable[[Params], object]]:
    """The admin service's methods these modules implement, by protocol method name."""
    from broker.admin.messages import MessageOps
    from broker.admin.store import store_status
    from broker.admin.topics import topic_status
    from broker.admin.trace import trace_message

    ops = MessageOps(broker)
    return {
        "QueryMessage": ops.query,
        "SendMessage": ops.send,
        "ReconsumeMessage": ops.reconsume,
        "TraceMessage": lambda params: trace_message(broker, params),
        "TopicStatus": lambda params: topic_status(broker, params),
        "StoreStatus": lambda params: store_status(broker, params),
        **_group_methods(broker),
    }


def _group_methods(broker: Broker) -> dict[str, Callable[[Params], object]]:
    """Dead letters and groups (`broker.admin.dlq`, `broker.admin.groups`)."""
    from broker.admin import groups
    from broker.admin.dlq import DeadLetterOps

    dead = DeadLetterOps(broker)
    return {
        "ListDeadLetters": dead.list,
        "ReplayDeadLetters": dead.replay,
        "DeadLetterAudit": dead.audit,
        "GroupProgress": lambda params: groups.group_progress(broker, params),
        "ResetGroupOffset": lambda params: groups.reset_group_offset(broker, params),
        "DeleteGroup": lambda params: groups.delete_group(broker, params),
        "DeleteTopic": lambda params: groups.delete_topic(broker, params),
    }
