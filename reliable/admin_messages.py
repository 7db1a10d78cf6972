"""Operator calls on messages and topics, over the broker's admin service.

Each function takes an admin caller: anything with `call(method, **params)` returning the
result object, such as `AdminClient(endpoint)` for a running broker (the CLI wraps a
stopped store in the same shape). Results are the JSON documents the admin service
returns (see `broker.admin`), so a script sees exactly what `reliable admin message ...
--json` prints.

    client = AdminClient("127.0.0.1:8081")
    found = query_messages(client, key="order-42", topic="orders")
    for m in found["messages"]:
        print(m["offset_msg_id"], m["store_time"])
    trace = trace_message(client, "order-42")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, Required, TypedDict

from reliable.message import new_message_id

MAX_LIMIT = 1000


class AdminCaller(Protocol):
    """The admin service as a callable (AdminClient, or a store opened in-process)."""

    def call(self, method: str, **params: object) -> Any: ...


class TraceEvent(TypedDict, total=False):
    """One entry of a trace's timeline (`trace_message`'s `events`, and the outbox's and
    consumers' ones `reliable admin message trace --db` adds): the keys every entry has
    and the ones the timeline orders by; the broker's carry more (topic, queue, ...)."""

    time_ms: Required[int | None]
    time: Required[str | None]
    source: Required[str]  # "broker", "outbox" or "consumer"
    kind: Required[str]
    group: Required[str | None]
    detail: Required[str]
    message_id: str | None
    log_offset: int  # the broker's: the commitlog offset of the record that says so


def _given(**params: object) -> dict[str, object]:
    return {k: v for k, v in params.items() if v is not None}


def query_messages(
    admin: AdminCaller,
    *,
    msg_id: str | None = None,
    key: str | None = None,
    unique_key: str | None = None,
    topic: str | None = None,
    queue: int | None = None,
    offset: int | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
    limit: int = 32,
    body: bool = False,
) -> dict[str, Any]:
    """`{"messages": [...], "more": bool}`, newest first; one query form (see
    `broker.admin.messages`): `msg_id`; `key` or `unique_key` with `topic`; `topic`,
    `queue` and `offset`; or `topic` with `since_ms`/`until_ms`."""
    result: dict[str, Any] = admin.call(
        "QueryMessage",
        **_given(
            id=msg_id,
            key=key,
            unique_key=unique_key,
            topic=topic,
            queue=queue,
            offset=offset,
            since_ms=since_ms,
            until_ms=until_ms,
            limit=limit,
            body=body,
        ),
    )
    return result


def trace_message(
    admin: AdminCaller,
    key_or_id: str,
    *,
    topic: str | None = None,
    limit: int | None = None,
    scan: int | None = None,
) -> dict[str, Any]:
    """Every broker record of one business message and what each group did with it."""
    result: dict[str, Any] = admin.call(
        "TraceMessage", **_given(key=key_or_id, topic=topic, limit=limit, scan=scan)
    )
    return result


def send_message(
    admin: AdminCaller,
    topic: str,
    body: bytes | str,
    *,
    keys: Sequence[str] = (),
    tag: str | None = None,
    properties: Mapping[str, str] | None = None,
    message_id: str | None = None,
    queue: int | None = None,
) -> dict[str, Any]:
    """Store one message; returns its ids and offsets. A fresh client message id is made
    when `message_id` is not given (as a producer would)."""
    payload: dict[str, object] = (
        {"body": body} if isinstance(body, str) else {"body_hex": bytes(body).hex()}
    )
    result: dict[str, Any] = admin.call(
        "SendMessage",
        **_given(
            topic=topic,
            keys=list(keys),
            tag=tag,
            properties=dict(properties or {}),
            message_id=message_id or new_message_id(),
            queue=queue,
            **payload,
        ),
    )
    return result


def reconsume_message(
    admin: AdminCaller,
    msg_id: str,
    group: str,
    *,
    topic: str | None = None,
    operator: str | None = None,
) -> dict[str, Any]:
    """Deliver one stored message to `group` again, through `%RETRY%<group>`."""
    result: dict[str, Any] = admin.call(
        "ReconsumeMessage", **_given(id=msg_id, group=group, topic=topic, operator=operator)
    )
    return result


def consume_directly(
    admin: AdminCaller,
    msg_id: str,
    group: str,
    client_id: str,
    *,
    topic: str | None = None,
    timeout_ms: int | None = None,
    operator: str | None = None,
) -> dict[str, Any]:
    """Deliver one stored message to one live client of `group` and return its verdict
    (RocketMQ's CONSUME_MESSAGE_DIRECTLY): `{msg_id, group, client_id, source, consumed,
    status, message, elapsed_ms}`; `consumed` is True when the client's listener
    succeeded. Nothing is written to the store and nothing is acknowledged. Needs a
    running broker; `AdminCallError` NOT_FOUND (with `details["live_clients"]`) when the
    client is not a live consumer of the group, PROXY_TIMEOUT when it does not answer
    within `timeout_ms` (default 5,000)."""
    result: dict[str, Any] = admin.call(
        "ReconsumeMessage",
        **_given(
            id=msg_id,
            group=group,
            client_id=client_id,
            topic=topic,
            timeout_ms=timeout_ms,
            operator=operator,
        ),
    )
    return result


def topic_status(admin: AdminCaller, topic: str) -> dict[str, Any]:
    """Per queue: min and max offset, messages held, first and last store time."""
    result: dict[str, Any] = admin.call("TopicStatus", topic=topic)
    return result
