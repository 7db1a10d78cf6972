"""The client side of a running server's admin service (`reliable.admin.v1.Admin`).

`AdminClient(endpoint).call("CreateTopic", name="orders")` sends one unary call whose
request and response bodies are JSON objects (the methods and their parameters are listed in
`broker.server.admin`; the wire: `protocol.admin`); a refusal raises `AdminCallError` with
the protocol code name, a broker that cannot be reached raises `grpc.RpcError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc

from broker.config import with_default_port
from protocol import admin as admin_wire
from protocol.signing import authorization
from reliable.errors import ReliableError

__all__ = ["AdminCallError", "AdminClient", "PromotionRefused"]


class AdminCallError(ReliableError):
    """A remote admin call was refused; `code` is the protocol code name (e.g. BAD_REQUEST),
    `details` what the refusal says beyond its message (e.g. `live_clients`); `reason`
    the refusal's kind when the method names one (else "")."""

    def __init__(
        self,
        code: str,
        message: str,
        details: dict[str, Any] | None = None,
        reason: str = "",
    ) -> None:
        self.code = code
        self.details = details or {}
        self.reason = reason
        super().__init__(f"{code}: {message}")


class PromotionRefused(AdminCallError):
    """`AdminClient.promote` refused; `reason` is `not-a-slave`, `not-caught-up`,
    `master-alive` or `ha-port` (docs/ha.md, promotion)."""


def _decode(raw: bytes) -> dict[str, Any]:
    # not an answer of the admin service: refused as UNKNOWN
    return admin_wire.decode(raw) or {}


class AdminClient:
    """Calls `reliable.admin.v1.Admin` on a running server.

    `endpoint` may name several servers separated by ';' (the masters of a cluster's broker
    groups, docs/ha.md): each call then runs on every one of them in turn, so a topic or a
    group is created (updated, deleted) in every group; the first server's result is
    returned, and the first refusal raises."""

    def __init__(
        self,
        endpoint: str,
        *,
        tls: bool = False,
        ca_file: str | None = None,
        access_key: str = "",
        secret_key: str = "",
        timeout_s: float = 10.0,
    ) -> None:
        endpoint = with_default_port(endpoint)  # `host` alone: the server's default port
        targets = [part.strip() for part in endpoint.split(";") if part.strip()] or [endpoint]
        if tls:
            roots = Path(ca_file).read_bytes() if ca_file else None
            self._channels = [
                grpc.secure_channel(t, grpc.ssl_channel_credentials(roots)) for t in targets
            ]
        else:
            self._channels = [grpc.insecure_channel(t) for t in targets]
        self._channel = self._channels[0]
        self._access_key, self._secret_key = access_key, secret_key
        self._timeout_s = timeout_s

    def _metadata(self) -> list[tuple[str, str]]:
        if not self._access_key:
            return []
        now = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        return [
            ("x-mq-date-time", now),
            ("authorization", authorization(self._access_key, self._secret_key, now)),
        ]

    def call(self, method: str, **params: object) -> Any:
        """The `result` of `method` called with `params`; AdminCallError when refused."""
        results = [self._call(channel, method, params) for channel in self._channels]
        return results[0]

    def _call(self, channel: Any, method: str, params: Mapping[str, object]) -> Any:
        stub = channel.unary_unary(
            admin_wire.method_path(method),
            request_serializer=admin_wire.encode,
            response_deserializer=_decode,
        )
        # a call that waits on a client (timeout_ms) gets that long on top
        waits = params.get("timeout_ms")
        timeout = self._timeout_s + (waits / 1000 if isinstance(waits, int) else 0)
        reply = stub(params, timeout=timeout, metadata=self._metadata())
        if not reply.get("ok"):
            code, message = str(reply.get("code", "UNKNOWN")), str(reply.get("message", ""))
            details = reply.get("details")
            reason = str(reply.get("reason", ""))
            if method == "PromoteBroker" and reason:
                raise PromotionRefused(code, message, reason=reason)
            raise AdminCallError(
                code, message, details if isinstance(details, dict) else None, reason=reason
            )
        return reply.get("result")

    def ha_status(self) -> dict[str, Any]:
        """The broker's replication role, offsets and lag (`HaStatus`, docs/ha.md)."""
        result: dict[str, Any] = self.call("HaStatus")
        return result

    def promote(self, *, sync: bool = False, force: bool = False) -> dict[str, Any]:
        """Turn this running slave into the master of its group (async-master, or
        sync-master with `sync`); `{"before", "after", ...}` statuses. PromotionRefused
        when it is not a caught-up slave of a dead master (`force` skips those checks)."""
        result: dict[str, Any] = self.call("PromoteBroker", sync=sync, force=force)
        return result

    def close(self) -> None:
        for channel in self._channels:
            channel.close()
