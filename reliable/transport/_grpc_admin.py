"""The grpc transport's group administration: what our server's admin service
(`reliable.admin.v1.Admin`, `protocol.admin`) offers a consumer beyond the protocol, which
has no such calls: where a new group starts, a FIFO group, a parked message group.

A server without the service (an Apache RocketMQ proxy) answers UNIMPLEMENTED: the call
returns False and says once what to do there instead.
"""

from __future__ import annotations

import json
import logging

import grpc

from reliable.errors import BrokerCallError, FailureKind, TransportError
from reliable.transport._grpc_session import GrpcSession
from reliable.transport.base import ConsumeFrom

log = logging.getLogger("reliable.transport.grpc")

_NO_ADMIN = {
    "SetGroupStart": "a new consumer group starts where the server's default puts it "
    "(set it with mqadmin resetOffsetByTime)",
    "ParkMessageGroup": "parked message groups are kept by each consumer only",
    "MakeGroupFifo": "an orderly consumer's group must be FIFO on the server "
    "(mqadmin updateSubGroup -o true)",
}
Params = dict[str, str | int]


class GroupAdminCalls:
    """`Capability.GROUP_ADMIN` over the session's access point."""

    def __init__(self, session: GrpcSession) -> None:
        self._session = session
        self._no_admin: set[str] = set()

    def _admin(self, method: str, params: Params) -> bool:
        """Call `reliable.admin.v1.Admin/<method>`; False (logged once per method) when the
        server does not offer it, e.g. an Apache RocketMQ proxy."""
        session = self._session
        call = session.json_method(f"/reliable.admin.v1.Admin/{method}")
        try:
            reply = call(
                json.dumps(params).encode(),
                timeout=session.timeout,
                metadata=session.metadata(session.base_id),
            )
        except grpc.RpcError as exc:
            if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                if method not in self._no_admin:
                    self._no_admin.add(method)
                    log.warning(
                        "%s does not offer %s (no reliable admin service): %s",
                        session.endpoint,
                        method,
                        _NO_ADMIN.get(method, ""),
                    )
                return False
            raise TransportError(
                f"{method} to {session.endpoint}: {exc.code().name}: {exc.details()}"
            ) from None
        if not isinstance(reply, dict) or not reply.get("ok"):
            message = reply.get("message") if isinstance(reply, dict) else reply
            code = reply.get("code") if isinstance(reply, dict) else None
            raise BrokerCallError(FailureKind.BAD_REQUEST, f"{method}: {message}", code=str(code))
        return True

    def set_group_start(
        self, group: str, topic: str, where: ConsumeFrom, timestamp_ms: int | None = None
    ) -> bool:
        """Where a new group starts on `topic` (`SetGroupStart`)."""
        params: Params = {"group": group, "topic": topic, "consume_from": where.value}
        if timestamp_ms is not None:
            params["timestamp_ms"] = timestamp_ms
        return self._admin("SetGroupStart", params)

    def make_group_fifo(self, group: str) -> bool:
        """Make the server's group FIFO, keeping its other settings (`MakeGroupFifo`)."""
        return self._admin("MakeGroupFifo", {"group": group})

    def park_message_group(self, group: str, topic: str, message_group: str) -> bool:
        """Park a message group on the server (`ParkMessageGroup`)."""
        return self._admin(
            "ParkMessageGroup", {"group": group, "topic": topic, "message_group": message_group}
        )
