"""Per-group resends: a send to `%RETRY%<group>` carrying `RETRY_TOPIC`, for that group alone.

The outbox's resend worker sends a message one consumer group lost (and the others
confirmed) to that group's retry topic, with the original topic in the `RETRY_TOPIC`
property; the broker delivers it to that group only, under the original topic. The
protocol reserves the property (`validation.RESERVED_PROPERTIES`), and the Apache proxy
refuses it; this server accepts it, when its `group-resend` capability is on
(`ServerConfig.group_resend`, advertised by `reliable.v1.BatchMessaging/Capabilities`,
`protocol.ext`), for a send that is a well-formed per-group resend and nothing else:

- the topic is `%RETRY%<group>`, and the group is a valid, non-system group that exists
  (or that a consumer's receive would create: `auto_create_group`);
- `RETRY_TOPIC` names a valid user topic (not a system, retry or dead-letter topic) that
  exists (a resend never creates a topic), that the caller may write (write permission:
  the access key the call was verified with is the caller's authority over any topic) and
  whose type accepts the message's type;
- the message is NORMAL or FIFO: a delayed or transactional resend is refused.

Anything else carrying `RETRY_TOPIC` is refused as before (`ILLEGAL_MESSAGE_PROPERTY_KEY`),
a missing group with `CONSUMER_GROUP_NOT_FOUND`, a missing original topic with
`ILLEGAL_TOPIC`, so the sender sees a typed reason.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from broker.server import validation
from broker.server.codes import Code
from broker.server.errors import Forbidden, IllegalMessage, IllegalTopic
from broker.topic import PERM_WRITE, TopicConfig
from protocol.names import (
    RETRY_GROUP_TOPIC_PREFIX,
    is_dlq_topic,
    is_retry_topic,
    topic_name_problem,
)
from protocol.props import Prop

# the one reserved property a per-group resend may carry
RETRY_TOPIC = Prop.RETRY_TOPIC
_RESEND_TYPES = frozenset({"NORMAL", "FIFO"})


def _refused(reason: str) -> IllegalMessage:
    return IllegalMessage(
        f"property {RETRY_TOPIC!r} is reserved by the broker: {reason}",
        Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
    )


def check_group_resend(
    topic: str,
    properties: Mapping[str, str],
    message_type: str,
    *,
    enabled: bool,
    group_config: Callable[[str], object],
    existing_topic: Callable[[str], TopicConfig | None],
) -> str:
    """Check a send carrying `RETRY_TOPIC` is a well-formed per-group resend; the group.

    `group_config(group)` raises `ConsumerGroupNotFound` for a group that does not exist
    (and may not be created); `existing_topic(name)` is the topic's config or None."""
    if not enabled:
        raise _refused("this server does not accept per-group resends")
    if not is_retry_topic(topic):
        raise _refused(f"allowed only on a per-group resend to {RETRY_GROUP_TOPIC_PREFIX}<group>")
    group = validation.check_group(topic[len(RETRY_GROUP_TOPIC_PREFIX) :])
    if message_type not in _RESEND_TYPES:
        raise _refused(f"a per-group resend is NORMAL or FIFO, not {message_type}")
    original = properties[RETRY_TOPIC]
    problem = topic_name_problem(original)
    if problem is not None:
        raise _refused(f"original topic {original[:130]!r} {problem}")
    if is_retry_topic(original) or is_dlq_topic(original):
        raise _refused(f"original topic {original!r} is a retry or dead-letter topic")
    validation.check_topic(original)  # not a system topic
    group_config(group)  # raises ConsumerGroupNotFound
    cfg = existing_topic(original)
    if cfg is None:
        raise IllegalTopic(f"original topic {original!r} does not exist (a resend creates none)")
    if not cfg.perm & PERM_WRITE:
        raise Forbidden(f"topic {original!r} is not writeable")
    validation.check_type_accepted(original, cfg.message_type.value, message_type)
    return group
