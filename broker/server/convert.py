"""Protocol messages <-> store messages.

A protocol `Message` becomes a store `Message` whose properties carry the system fields
(`TAGS`, `KEYS` space-separated, `UNIQ_KEY` = the client's message id, `__SHARDINGKEY` = the
message group, `TIMER_DELIVER_MS`, `TRAN_MSG`); every other property is the user's. The way
back rebuilds the same protocol fields, so tags, keys and properties survive the trip.

Times are range-checked here, where they leave the wire: a `Timestamp` must lie between the
epoch and the end of year 9999 (what protobuf itself calls valid, minus the years before
1970), a `Duration` within protobuf's +-10,000 years with nanos of the same sign. Anything
else is `BAD_REQUEST` (or the caller's more specific code) before it reaches the store,
whose records hold times as signed 64-bit milliseconds.
"""

from __future__ import annotations

import functools
import hashlib
import socket

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from broker.server.errors import BadRequest, ServerError
from broker.server.validation import RESERVED_PROPERTIES
from broker.store.message import Message, MessageExt
from protocol.clock import wall_ms
from protocol.pb import definition_pb2
from protocol.props import Prop

# protocol MessageType numbers
NORMAL, FIFO, DELAY, TRANSACTION = (
    definition_pb2.MessageType.Value(n) for n in ("NORMAL", "FIFO", "DELAY", "TRANSACTION")
)
TYPE_NAMES: dict[int, str] = {
    NORMAL: "NORMAL",
    FIFO: "FIFO",
    DELAY: "DELAY",
    TRANSACTION: "TRANSACTION",
}
ENCODING_IDENTITY = definition_pb2.Encoding.Value("IDENTITY")
# the body digest a delivered message carries: MD5, as the Apache proxy sends (body_digest)
DIGEST_MD5 = definition_pb2.DigestType.Value("MD5")

_SYSTEM_NAMES = RESERVED_PROPERTIES | {
    Prop.UNIQ_KEY,
    Prop.SHARDING_KEY,
    Prop.TIMER_DELIVER_MS,
    Prop.TRAN_MSG,
    Prop.PRODUCER_GROUP,
    Prop.REAL_TOPIC,
    Prop.REAL_QID,
    Prop.RETRY_TOPIC,
}
# broker-set properties a consumer may read (never set: sends reject them as reserved):
# where a dead letter came from, so a DLQ handler can tell
_SHOWN_SYSTEM_NAMES = frozenset({Prop.DLQ_ORIGIN_TOPIC, Prop.DLQ_ORIGIN_MESSAGE_ID})
_HIDDEN_ON_DELIVERY = _SYSTEM_NAMES - _SHOWN_SYSTEM_NAMES


# the last second of 9999-12-31 (protobuf's own upper bound for a Timestamp)
MAX_TIMESTAMP_S = 253_402_300_799
# protobuf's bound for a Duration: 10,000 years
MAX_DURATION_S = 315_576_000_000
MAX_NANOS = 999_999_999


def timestamp_ms(
    ts: Timestamp, what: str = "timestamp", error: type[ServerError] = BadRequest
) -> int:
    """A protobuf Timestamp as epoch milliseconds; `error` when it is out of range."""
    seconds, nanos = int(ts.seconds), int(ts.nanos)
    if not 0 <= seconds <= MAX_TIMESTAMP_S or not 0 <= nanos <= MAX_NANOS:
        raise error(f"{what} ({seconds} s, {nanos} ns) is outside 1970-01-01..9999-12-31")
    return seconds * 1000 + nanos // 1_000_000


def set_timestamp_ms(ts: Timestamp, ms: int) -> None:
    ts.seconds = ms // 1000
    ts.nanos = (ms % 1000) * 1_000_000


def duration_ms(d: Duration, what: str = "duration", error: type[ServerError] = BadRequest) -> int:
    """A protobuf Duration in milliseconds (negative when it is); `error` when malformed."""
    seconds, nanos = int(d.seconds), int(d.nanos)
    if (
        abs(seconds) > MAX_DURATION_S
        or abs(nanos) > MAX_NANOS
        or (seconds < 0 < nanos)
        or (nanos < 0 < seconds)
    ):
        raise error(f"{what} ({seconds} s, {nanos} ns) is not a valid duration")
    return seconds * 1000 + int(nanos / 1_000_000)


def set_duration_ms(d: Duration, ms: int) -> None:
    d.seconds = ms // 1000
    d.nanos = (ms % 1000) * 1_000_000


def message_type_of(sp: definition_pb2.SystemProperties) -> str:
    """The message's declared type name; unspecified falls back to what its fields imply.

    A type this server does not serve (LITE, PRIORITY, or a number the protocol lacks) is
    `BAD_REQUEST` rather than a guess.
    """
    declared = int(sp.message_type)
    if declared in TYPE_NAMES:
        return TYPE_NAMES[declared]
    if declared != 0:
        raise BadRequest(
            f"message type {declared} is not supported (NORMAL, FIFO, DELAY, TRANSACTION)"
        )
    if sp.HasField("message_group"):
        return "FIFO"
    if sp.HasField("delivery_timestamp"):
        return "DELAY"
    return "NORMAL"


def to_store(
    pm: definition_pb2.Message, queue_id: int, *, transactional: bool, producer_group: str | None
) -> Message:
    """Build the store message for one (already validated) protocol message."""
    sp = pm.system_properties
    user = pm.user_properties
    props: dict[str, str] = dict(user) if user else {}
    if sp.HasField("tag") and sp.tag:
        props[Prop.TAGS] = sp.tag
    keys = [k for k in sp.keys if k]
    if keys:
        props[Prop.KEYS] = " ".join(keys)
    props[Prop.UNIQ_KEY] = sp.message_id
    if sp.HasField("message_group") and sp.message_group:
        props[Prop.SHARDING_KEY] = sp.message_group
    if sp.HasField("delivery_timestamp"):
        props[Prop.TIMER_DELIVER_MS] = str(
            timestamp_ms(sp.delivery_timestamp, "delivery timestamp")
        )
    if transactional:
        props[Prop.TRAN_MSG] = "true"
        if producer_group:
            props[Prop.PRODUCER_GROUP] = producer_group
    born_ms = (
        timestamp_ms(sp.born_timestamp, "born timestamp") if sp.HasField("born_timestamp") else 0
    )
    return Message(
        topic=pm.topic.name,
        body=bytes(pm.body),
        queue_id=queue_id,
        properties=props,
        born_timestamp=born_ms if born_ms > 0 else wall_ms(),
        born_host=(host_only(sp.born_host), 0),
    )


@functools.lru_cache(maxsize=1024)  # a client sends with one born host, again and again
def host_only(born_host: str) -> str:
    """The IPv4 address in a client's `born_host` (`ip` or `ip:port`); loopback otherwise."""
    host = born_host.rsplit(":", 1)[0] if born_host.count(":") == 1 else born_host
    try:
        socket.inet_aton(host)
    except OSError:
        return "127.0.0.1"
    return host


_STORE_HOSTS: dict[tuple[str, int], str] = {}  # "ip:port" of each store host seen


def body_digest(body: bytes | bytearray | memoryview) -> str:
    """The MD5 of `body` as 32 upper-case hex digits: the body digest of a delivered message.

    The Apache proxy sends exactly this (its gRPC converter: `DigestType.MD5`, upper-case
    hex), and every official client checks it the same way. A CRC32 would not do: the
    Java and Go clients compare it to the CRC's hex without leading zeros, the Python
    client to 8 zero-padded digits, so one in 16 bodies would be corrupted for one of them
    whichever form we chose (docs/server.md, "The body digest").
    """
    return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()


def delivery_template(
    *, topic: str, namespace: str, invisible_ms: int | None = None
) -> definition_pb2.Message:
    """The fields every message of one delivery shares (topic, digest and encoding kinds,
    invisible duration), built once and copied into each by `fill_proto`."""
    pm = definition_pb2.Message()
    pm.topic.name = topic
    pm.topic.resource_namespace = namespace
    sp = pm.system_properties
    sp.body_digest.type = DIGEST_MD5
    sp.body_encoding = ENCODING_IDENTITY
    if invisible_ms is not None:
        set_duration_ms(sp.invisible_duration, invisible_ms)
    return pm


def fill_proto(
    pm: definition_pb2.Message,
    ext: MessageExt,
    *,
    template: definition_pb2.Message,
    receipt_handle: str | None,
    delivery_attempt: int,
) -> None:
    """Write into `pm` (a fresh protocol Message, e.g. a response's field, so nothing is
    copied twice) the message a consumer receives for one stored message; `template`
    comes from `delivery_template`. One pass over the properties, each field set once."""
    pm.CopyFrom(template)
    body = ext.body
    pm.body = body
    props = ext.properties
    hidden = _HIDDEN_ON_DELIVERY
    user = pm.user_properties
    for name, value in props.items():
        if name not in hidden:
            user[name] = value
    sp = pm.system_properties
    tags = props.get(Prop.TAGS)
    if tags:
        sp.tag = tags
    keys = props.get(Prop.KEYS)
    if keys:
        sp.keys.extend([k for k in keys.split(" ") if k])
    sp.message_id = props.get(Prop.UNIQ_KEY) or ext.offset_msg_id
    sp.body_digest.checksum = body_digest(body)
    group = props.get(Prop.SHARDING_KEY)
    deliver_ms = props.get(Prop.TIMER_DELIVER_MS)
    if group:
        sp.message_type = FIFO
        sp.message_group = group
    elif props.get(Prop.TRAN_MSG) == "true":
        sp.message_type = TRANSACTION
    elif deliver_ms or props.get(Prop.DELAY):
        sp.message_type = DELAY
    else:
        sp.message_type = NORMAL
    if deliver_ms and deliver_ms.isdigit():
        set_timestamp_ms(sp.delivery_timestamp, int(deliver_ms))
    ms = ext.born_timestamp
    ts = sp.born_timestamp
    ts.seconds, ts.nanos = ms // 1000, (ms % 1000) * 1_000_000
    sp.born_host = ext.born_host[0]
    ms = ext.store_timestamp
    ts = sp.store_timestamp
    ts.seconds, ts.nanos = ms // 1000, (ms % 1000) * 1_000_000
    store_host = _STORE_HOSTS.get(ext.store_host)
    if store_host is None:
        store_host = _STORE_HOSTS[ext.store_host] = f"{ext.store_host[0]}:{ext.store_host[1]}"
    sp.store_host = store_host
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    sp.queue_id = ext.queue_id
    sp.queue_offset = ext.queue_offset
    if delivery_attempt > 0:
        sp.delivery_attempt = delivery_attempt


def to_proto(
    ext: MessageExt,
    *,
    topic: str,
    namespace: str,
    receipt_handle: str | None,
    delivery_attempt: int,
    invisible_ms: int | None = None,
) -> definition_pb2.Message:
    """The protocol message a consumer receives for one stored message."""
    pm = definition_pb2.Message()
    fill_proto(
        pm,
        ext,
        template=delivery_template(topic=topic, namespace=namespace, invisible_ms=invisible_ms),
        receipt_handle=receipt_handle,
        delivery_attempt=delivery_attempt,
    )
    return pm
