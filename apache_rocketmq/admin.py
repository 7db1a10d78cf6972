"""Topics and consumer groups on an Apache RocketMQ broker, over its remoting protocol.

The 5.x proxy routes only to topics the name server knows and serves only consumer groups
the broker knows (its Settings answer "group not found" otherwise), so the interop tests
create both first. This is what `mqadmin updateTopic` / `updateSubGroup` send, without
starting a JVM per call.

A remoting frame (big-endian):

    +--------------+---------------------------+-------------+--------+
    | length (4 B) | 0x00 | header length (3 B)| JSON header | body   |
    +--------------+---------------------------+-------------+--------+
      length counts everything after itself; the byte 0x00 says "JSON header".

The header is `{"code", "language", "version", "opaque", "flag", "extFields"}`; every
`extFields` value is a string. A response carries the same opaque, `code` 0 for success
and `remark` for the reason otherwise.
"""

from __future__ import annotations

import enum
import itertools
import json
import socket
import struct
from collections.abc import Mapping, Sequence
from typing import Any

UPDATE_AND_CREATE_TOPIC = 17
GET_ROUTEINFO_BY_TOPIC = 105
UPDATE_BROKER_CONFIG = 25
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
_SUCCESS = 0
_HEADER_TYPE_JSON = 0
_PERM_READ_WRITE = 6
_opaque = itertools.count(1)


class MessageType(enum.Enum):
    """A 5.x topic's `message.type` attribute: the proxy refuses a send of another type."""

    NORMAL = "NORMAL"
    FIFO = "FIFO"
    DELAY = "DELAY"
    TRANSACTION = "TRANSACTION"
    MIXED = "MIXED"


class AdminError(RuntimeError):
    """The broker refused an admin request, or could not be reached."""


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise AdminError("the broker closed the connection mid-answer")
        chunks += chunk
    return bytes(chunks)


def call(
    address: tuple[str, int],
    code: int,
    ext_fields: dict[str, str],
    body: bytes = b"",
    *,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    """One request, one answer; raises AdminError unless the answer's code is success."""
    opaque = next(_opaque)
    header = json.dumps(
        {
            "code": code,
            "language": "PYTHON",
            "version": 0,
            "opaque": opaque,
            "flag": 0,
            "extFields": ext_fields,
        }
    ).encode()
    frame = struct.pack(">I", (_HEADER_TYPE_JSON << 24) | len(header)) + header + body
    try:
        with socket.create_connection(address, timeout=timeout_s) as sock:
            sock.sendall(struct.pack(">I", len(frame)) + frame)
            (length,) = struct.unpack(">I", _read_exactly(sock, 4))
            answer = _read_exactly(sock, length)
    except OSError as exc:
        raise AdminError(f"broker {address[0]}:{address[1]}: {exc}") from exc
    (marked,) = struct.unpack(">I", answer[:4])
    reply: dict[str, Any] = json.loads(answer[4 : 4 + (marked & 0xFFFFFF)])
    if reply.get("code") != _SUCCESS:
        raise AdminError(f"request {code} refused: {reply.get('code')} {reply.get('remark')}")
    return reply


def create_topic(
    address: tuple[str, int],
    topic: str,
    message_type: MessageType = MessageType.NORMAL,
    *,
    queues: int = 4,
) -> None:
    """Create (or update) `topic` with `queues` read and write queues of one message type."""
    call(
        address,
        UPDATE_AND_CREATE_TOPIC,
        {
            "topic": topic,
            "defaultTopic": "TBW102",
            "readQueueNums": str(queues),
            "writeQueueNums": str(queues),
            "perm": str(_PERM_READ_WRITE),
            "topicFilterType": "SINGLE_TAG",
            "topicSysFlag": "0",
            "order": "false",
            "attributes": f"+message.type={message_type.value}",
        },
    )


def routed(namesrv: tuple[str, int], topic: str) -> bool:
    """Whether the name server has a route for `topic` (what the proxy asks it on a
    client's first QueryRoute). A broker registers a new topic with the name server after
    it answered the creation, and the proxy remembers a topic it found no route for (for
    about 20 s): a client started before the name server knows the topic fails with
    "No topic route info in name server" instead of waiting."""
    try:
        call(namesrv, GET_ROUTEINFO_BY_TOPIC, {"topic": topic}, timeout_s=3.0)
    except AdminError:
        return False
    return True


def create_group(
    address: tuple[str, int],
    group: str,
    *,
    orderly: bool = False,
    retry_max_times: int = 16,
    retry_delays_ms: Sequence[int] | None = None,
) -> None:
    """Create (or update) a consumer group; `orderly` makes the proxy deliver it FIFO.

    `retry_delays_ms`: the group's retry ladder (a CUSTOMIZED `groupRetryPolicy`), which the
    proxy hands gRPC consumers in their Settings (`backoff_policy.customized_backoff`);
    the broker's default ladder (1s 5s 10s 30s 1m ...) when None."""
    config: dict[str, Any] = {
        "groupName": group,
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "consumeMessageOrderly": orderly,
        "retryQueueNums": 1,
        "retryMaxTimes": retry_max_times,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
    }
    if retry_delays_ms is not None:
        config["groupRetryPolicy"] = {
            "type": "CUSTOMIZED",
            "customizedRetryPolicy": {"next": [int(ms) for ms in retry_delays_ms]},
        }
    call(address, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, json.dumps(config).encode())


def update_broker_config(address: tuple[str, int], values: Mapping[str, object]) -> None:
    """Change broker settings while it runs (`mqadmin updateBrokerConfig`): the body is a
    properties text. Settings the broker reads on each use (the transaction check's
    `transactionTimeOut`, ...) take effect at once."""
    lines = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]
    call(address, UPDATE_BROKER_CONFIG, {}, ("\n".join(lines) + "\n").encode())
