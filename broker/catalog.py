"""The broker's topics and groups as its calls see them: the two tables (`topic.py`,
`subscription.py`), what a call may do with a name, and what is created on demand.

- A user topic is created on its first send when `auto_create_topic` is on, with
  `default_queue_nums` queues and any message type.
- A group is created on its first use when `auto_create_subscription_group` is on, with
  `default_retry_max_times`.
- `%RETRY%<group>` and `%DLQ%<group>` are created when first needed, from the group's
  settings: its retry topic with `retry_queue_nums` queues (widened when the group's setting
  grows), its dead-letter topic with one.

Deleting a topic or a group forgets it in the other tables too (offsets, leases, parked
message groups, the store's files): that is the facade's (`Broker.delete_topic`), which
holds them all.
"""

from __future__ import annotations

from broker.config import BrokerConfig
from broker.errors import (
    ConsumeDisabled,
    GroupNotFound,
    InvalidArgument,
    NoPermission,
    TopicNotFound,
)
from broker.names import validate_group_name, validate_user_topic
from broker.results import TopicRoute
from broker.store.message import Message
from broker.subscription import SubscriptionGroupConfig, SubscriptionGroupManager
from broker.topic import PERM_READ_WRITE, TopicConfig, TopicConfigManager, TopicMessageType
from protocol.limits import DEFAULT_QUEUE_NUMS, DEFAULT_RETRY_MAX_TIMES
from protocol.names import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    is_dlq_topic,
    is_retry_topic,
)


class Catalog:
    """Lookups, creation and permission checks over the topic and group tables."""

    def __init__(
        self,
        config: BrokerConfig,
        topics: TopicConfigManager,
        groups: SubscriptionGroupManager,
    ) -> None:
        # read for defaults and auto-creation alone: fields a promotion never changes
        self._config = config
        self.topics = topics
        self.groups = groups

    # ------------------------------------------------------------------ an admin's calls
    def create_topic(
        self,
        name: str,
        *,
        queues: int = DEFAULT_QUEUE_NUMS,
        perm: int = PERM_READ_WRITE,
        message_type: str | TopicMessageType = "NORMAL",
        read_queues: int | None = None,
        write_queues: int | None = None,
    ) -> TopicConfig:
        """Create or update a topic (an upsert, like mqadmin updateTopic)."""
        validate_user_topic(name)
        mtype = TopicMessageType.parse(message_type)
        cfg = TopicConfig(
            name,
            read_queue_nums=read_queues or queues,
            write_queue_nums=write_queues or queues,
            perm=perm,
            message_type=mtype,
            order=mtype is TopicMessageType.FIFO,
        )
        return self.topics.put(cfg)

    def create_group(
        self,
        group: str,
        *,
        retry_max_times: int = DEFAULT_RETRY_MAX_TIMES,
        retry_queue_nums: int = 1,
        consume_broadcast: bool = True,
        fifo: bool = False,
        consume_enable: bool = True,
    ) -> SubscriptionGroupConfig:
        """Create or update a subscription group (an upsert)."""
        validate_group_name(group)
        return self.groups.put(
            SubscriptionGroupConfig(
                group,
                consume_enable=consume_enable,
                consume_broadcast=consume_broadcast,
                retry_queue_nums=retry_queue_nums,
                retry_max_times=retry_max_times,
                fifo=fifo,
            )
        )

    def route(self, topic: str) -> TopicRoute:
        """Queues and permission of a topic; auto-creates it when configured."""
        cfg = self.topic(topic, create=True)
        return TopicRoute(
            cfg.name, cfg.read_queue_nums, cfg.write_queue_nums, cfg.perm, cfg.message_type
        )

    def max_delivery_attempts(self, group: str) -> int:
        """The group's retries plus its first delivery (the broker's default for a group
        not in the table)."""
        cfg = self.groups.get(group)
        retries = cfg.retry_max_times if cfg else self._config.default_retry_max_times
        return retries + 1

    # ------------------------------------------------------------------ the broker's lookups
    def group(self, group: str) -> SubscriptionGroupConfig:
        """The group's settings, created when allowed; GroupNotFound otherwise."""
        validate_group_name(group)
        cfg = self.groups.get(group)
        if cfg is not None:
            return cfg
        if not self._config.auto_create_subscription_group:
            raise GroupNotFound(group)
        return self.groups.get_or_create(
            SubscriptionGroupConfig(group, retry_max_times=self._config.default_retry_max_times)
        )

    def topic(self, name: str, *, create: bool) -> TopicConfig:
        """The topic's config: a retry or DLQ topic created on demand, a user topic created
        when `create` and the broker allows it; TopicNotFound otherwise."""
        validate_user_topic(name)
        cfg = self.topics.get(name)
        if cfg is not None:
            return cfg
        derived = self.derived(name)
        if derived is not None:
            return derived
        if create and self._config.auto_create_topic:
            return self.topics.get_or_create(
                TopicConfig(
                    name,
                    self._config.default_queue_nums,
                    self._config.default_queue_nums,
                    PERM_READ_WRITE,
                    TopicMessageType.MIXED,
                )
            )
        raise TopicNotFound(name)

    def readable(self, group: str, topic: str, queue_id: int | None) -> TopicConfig:
        """The topic's config, when `group` may consume and `topic` (and its `queue_id`,
        when one is named) may be read."""
        gcfg = self.group(group)
        if not gcfg.consume_enable:
            raise ConsumeDisabled(group)
        cfg = self.topic(topic, create=False)
        if not cfg.readable:
            raise NoPermission(topic, "readable", cfg.perm)
        if queue_id is not None and (
            not isinstance(queue_id, int) or not 0 <= queue_id < cfg.read_queue_nums
        ):
            raise InvalidArgument(
                f"queue id {queue_id!r} is not one of the "
                f"{cfg.read_queue_nums} read queues of {topic!r}"
            )
        return cfg

    def derived(self, name: str) -> TopicConfig | None:
        """A retry or DLQ topic, created on demand from its group's settings; None for any
        other name."""
        if is_retry_topic(name):
            group = self.group(name[len(RETRY_GROUP_TOPIC_PREFIX) :])
            cfg = TopicConfig(
                name,
                group.retry_queue_nums,
                group.retry_queue_nums,
                PERM_READ_WRITE,
                TopicMessageType.MIXED,
            )
        elif is_dlq_topic(name):
            self.group(name[len(DLQ_GROUP_TOPIC_PREFIX) :])
            cfg = TopicConfig(name, 1, 1, PERM_READ_WRITE, TopicMessageType.MIXED)
        else:
            return None
        existing = self.topics.get_or_create(cfg)
        if is_retry_topic(name):
            existing = self.topics.widen_queues(name, cfg.read_queue_nums)
        return existing

    def ensure_derived_topic(self, msg: Message) -> None:
        """Before a retry or dead-letter copy is stored: its topic exists."""
        if self.topics.get(msg.topic) is None:
            self.derived(msg.topic)
