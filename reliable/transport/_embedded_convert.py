"""The embedded transport's conversions: the client's message to the store's and back, and
the client's error for a broker exception (`translate`, by the same classification as the
grpc transport's: `broker.error_codes`, `protocol.codes`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker import errors as berr
from broker.error_codes import code_of
from broker.store import errors as serr
from broker.store.message import Message as StoreMessage
from broker.store.message import MessageExt, encode_offset_msg_id
from protocol.codes import failure_kind
from protocol.names import is_retry_topic
from protocol.props import Prop
from reliable.errors import BadRequest, BrokerUnavailable, ReceiptHandleError, call_error
from reliable.message import Message, ReceivedMessage

# properties the client maps onto ReceivedMessage fields instead of `properties`
_MAPPED = {Prop.TAGS, Prop.KEYS, Prop.UNIQ_KEY, Prop.SHARDING_KEY, Prop.TIMER_DELIVER_MS}


def translate(exc: BaseException) -> BaseException:
    """The client's error for a broker or store exception, classified as the gRPC transport
    classifies the code the server would answer with (`broker.error_codes.code_of`, then
    `protocol.codes.failure_kind`): the same failure is retried, or not, the same way."""
    if isinstance(exc, berr.ReceiptHandleError):
        return ReceiptHandleError(exc.handle, exc.reason)
    # the store refuses writes (disk full, not running): the refusal is kept, a full disk
    # is said as such (`BrokerUnavailable.disk_full`); a kind like any INTERNAL_SERVER_ERROR
    if isinstance(exc, serr.StoreNotRunning):
        return BrokerUnavailable(
            str(exc), reason="SERVICE_NOT_AVAILABLE", code="SERVICE_NOT_AVAILABLE"
        )
    if isinstance(exc, berr.BrokerError) and exc.code is berr.ResponseCode.SERVICE_NOT_AVAILABLE:
        name = exc.code.name
        reason = exc.status if isinstance(exc, berr.SendRejected) else name
        return BrokerUnavailable(str(exc), reason=reason, code=name)
    code = code_of(exc)
    ours = isinstance(exc, berr.BrokerError) and not isinstance(exc, serr.StoreError)
    message = str(exc) if ours else f"{type(exc).__name__}: {exc}"
    return call_error(failure_kind(code), message, code=code.name)


def call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except berr.BrokerError as exc:  # the store's errors included
        raise translate(exc) from exc


def to_store_message(m: Message, queue_id: int) -> StoreMessage:
    if (
        not m.properties
        and not m.tags
        and not m.keys
        and m.message_group is None
        and m.delay_level is None
        and m.deliver_at_ms is None
    ):
        # the usual message: only its id travels as a property
        return StoreMessage(m.topic, bytes(m.body), queue_id, 0, {Prop.UNIQ_KEY: m.message_id})
    props = dict(m.properties)
    for reserved in (Prop.TAGS, Prop.KEYS, Prop.UNIQ_KEY, Prop.DELAY, Prop.TIMER_DELIVER_MS):
        if reserved in props:
            raise BadRequest(f"property {reserved!r} is reserved; use the Message field")
    if m.tags:
        props[Prop.TAGS] = m.tags
    if m.keys:
        props[Prop.KEYS] = " ".join(m.keys)
    props[Prop.UNIQ_KEY] = m.message_id
    if m.message_group is not None:
        props[Prop.SHARDING_KEY] = m.message_group
    if m.delay_level is not None:
        props[Prop.DELAY] = str(m.delay_level)
    if m.deliver_at_ms is not None:
        props[Prop.TIMER_DELIVER_MS] = str(m.deliver_at_ms)
    return StoreMessage(topic=m.topic, body=bytes(m.body), queue_id=queue_id, properties=props)


# offset message ids by store host: the host's 16 hex digits, then the offset's 16
_HOST_PREFIX: dict[tuple[str, int], str] = {}


def offset_msg_id(msg: MessageExt) -> str:
    prefix = _HOST_PREFIX.get(msg.store_host)
    if prefix is None:
        if len(_HOST_PREFIX) > 64:
            _HOST_PREFIX.clear()
        prefix = _HOST_PREFIX[msg.store_host] = encode_offset_msg_id(msg.store_host, 0)[:16]
    offset = msg.commitlog_offset
    if offset < 0:
        return encode_offset_msg_id(msg.store_host, offset)
    return f"{prefix}{offset:016X}"


def to_received(
    msg: MessageExt, *, receipt_handle: str | None = None, attempt: int | None = None
) -> ReceivedMessage:
    props = msg.properties
    get = props.get
    topic = msg.topic
    if is_retry_topic(topic) and Prop.RETRY_TOPIC in props:
        topic = props[Prop.RETRY_TOPIC]  # a retry copy is shown as its original topic
    due = get(Prop.TIMER_DELIVER_MS)
    offset_id = offset_msg_id(msg)
    raw_keys = get(Prop.KEYS)
    # a producer's plain message carries its UNIQ_KEY alone: nothing of the user's to copy
    user = (
        {}
        if len(props) == 1 and Prop.UNIQ_KEY in props
        else {k: v for k, v in props.items() if k not in _MAPPED}
    )
    return ReceivedMessage(
        get(Prop.UNIQ_KEY) or offset_id,
        topic,
        msg.body,
        msg.queue_id,
        msg.queue_offset,
        get(Prop.TAGS),
        [k for k in raw_keys.split(" ") if k] if raw_keys else [],
        user,
        attempt - 1 if attempt is not None else msg.reconsume_times,
        msg.born_timestamp,
        msg.store_timestamp,
        get(Prop.SHARDING_KEY) or None,
        None,
        offset_id,
        receipt_handle,
        get("__transactionId__") or None,
        int(due) if due and due.isdigit() else None,
        msg,
    )
