"""What the console reads from (and, with `--allow-actions`, asks of) a running broker,
through its admin service only (`reliable.admin.AdminClient`).

Every method returns the admin service's JSON documents, lightly combined (a group's lag
over all the topics it consumes, say). A method the broker does not serve (an older
broker) raises `NotAvailable`, which the pages show as a panel instead of an error; a
broker that cannot be reached raises `BrokerDown`; a refusal is `reliable.admin.
AdminCallError` as the client raises it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import grpc

from protocol.names import dlq_topic, is_dlq_topic, is_retry_topic, is_system_topic, retry_topic
from reliable.admin import AdminCallError, AdminClient
from reliable.errors import ReliableError


class ConsoleError(ReliableError):
    """Something the console could not read or do; the page says what."""


class NotAvailable(ConsoleError):
    """The broker does not serve this admin method (it predates it)."""

    def __init__(self, method: str) -> None:
        self.method = method
        super().__init__(f"{method} is not available on this broker")


class BrokerDown(ConsoleError):
    """The broker did not answer (not running, wrong address, or too slow)."""


def is_user_topic(name: str) -> bool:
    return not (is_retry_topic(name) or is_dlq_topic(name) or is_system_topic(name))


@dataclass
class GroupLag:
    """One group's position on every topic it has offsets on, summed over queues."""

    group: str
    topics: dict[str, dict[str, int]] = field(default_factory=dict)  # topic -> lag, consumed
    lag: int = 0
    consumed: int = 0  # the sum of committed offsets (its difference over time: throughput)
    retry_depth: int = 0
    dlq_depth: int = 0
    consumers: int = 0


class BrokerView:
    """The console's one admin connection (thread-safe: grpc channels are)."""

    def __init__(
        self,
        endpoint: str,
        *,
        access_key: str = "",
        secret_key: str = "",
        tls: bool = False,
        ca_file: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.endpoint = endpoint
        self._options = {"tls": tls, "ca_file": ca_file, "timeout_s": timeout_s}
        self._client = AdminClient(
            endpoint,
            access_key=access_key,
            secret_key=secret_key,
            tls=tls,
            ca_file=ca_file,
            timeout_s=timeout_s,
        )
        self._missing: set[str] = set()
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------------ calls
    def call(self, method: str, **params: object) -> Any:
        """One admin call; NotAvailable / BrokerDown / AdminCallError."""
        if method in self._missing:
            raise NotAvailable(method)
        try:
            return self._client.call(method, **params)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            if code is grpc.StatusCode.UNIMPLEMENTED:
                with self._lock:
                    self._missing.add(method)
                raise NotAvailable(method) from None
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            raise BrokerDown(
                f"broker {self.endpoint} did not answer {method}: "
                f"{code.name if code else 'ERROR'} {detail or ''}".strip()
            ) from None

    def available(self, method: str) -> bool:
        """False once a call found the method missing (until then assumed present)."""
        return method not in self._missing

    def credentials_accepted(self, access_key: str, secret_key: str) -> bool:
        """Whether the broker accepts this key pair (the console's broker-key login)."""
        probe = AdminClient(
            self.endpoint,
            access_key=access_key,
            secret_key=secret_key,
            **self._options,  # type: ignore[arg-type]
        )
        try:
            probe.call("ListTopics")
            return True
        except AdminCallError:
            return False
        except grpc.RpcError as exc:
            raise BrokerDown(f"broker {self.endpoint} did not answer: {exc}") from None
        finally:
            probe.close()

    # ------------------------------------------------------------------ reads
    def topics(self) -> list[dict[str, Any]]:
        return list(self.call("ListTopics")["topics"])

    def groups(self) -> list[dict[str, Any]]:
        return list(self.call("ListGroups")["groups"])

    def topic(self, name: str) -> dict[str, Any]:
        return dict(self.call("GetTopic", name=name))

    def topic_status(self, name: str) -> dict[str, Any]:
        return dict(self.call("TopicStatus", topic=name))

    def store_status(self) -> dict[str, Any]:
        return dict(self.call("StoreStatus"))

    def topic_depth(self, name: str) -> int:
        """Messages held in a topic (0 when it does not exist)."""
        try:
            t = self.topic(name)
        except AdminCallError as exc:
            if exc.code == "TOPIC_NOT_FOUND":
                return 0
            raise
        return sum(q["max_offset"] - q["min_offset"] for q in t.get("queues", []))

    def max_offsets(self, names: list[str]) -> dict[str, int]:
        """Per topic: the sum of its queues' max offsets (messages ever stored)."""
        out = {}
        for name in names:
            try:
                out[name] = sum(q["max_offset"] for q in self.topic(name).get("queues", []))
            except AdminCallError:
                continue  # deleted between the list and now
        return out

    def group_progress(self, group: str, topics: list[str]) -> dict[str, Any]:
        """`GroupProgress` when the broker serves it; otherwise the same figures from
        `GetGroup` per topic: {group, topics: [{topic, queues: [...], lag}], lag, ...}."""
        if self.available("GroupProgress"):
            try:
                return dict(self.call("GroupProgress", group=group))
            except NotAvailable:
                pass
        info = self.call("GetGroup", name=group)
        rows = []
        for topic in [*topics, retry_topic(group)]:
            try:
                got = self.call("GetGroup", name=group, topic=topic)
            except AdminCallError:
                continue
            queues = got.get("progress", {}).get("queues", [])
            if not any(q["consumer_offset"] >= 0 for q in queues):
                continue  # the group has never consumed this topic
            rows.append(
                {
                    "topic": topic,
                    "queues": [
                        {
                            "queue_id": q["queue_id"],
                            "committed_offset": q["consumer_offset"],
                            "max_offset": q["broker_offset"],
                            "lag": q["lag"],
                        }
                        for q in queues
                    ],
                    "lag": sum(q["lag"] for q in queues),
                }
            )
        return {
            "group": group,
            "consumers": info.get("consumers", []),
            "topics": rows,
            "settings": {k: v for k, v in info.items() if k not in ("consumers",)},
        }

    def group_lag(self, group: str, topics: list[str]) -> GroupLag:
        """Lag, consumption, retry and DLQ depth of one group, over every topic."""
        doc = self.group_progress(group, topics)
        out = GroupLag(group, consumers=len(doc.get("consumers", [])))
        for t in doc.get("topics", []):
            name = t["topic"]
            lag = int(t.get("lag", sum(q.get("lag", 0) for q in t.get("queues", []))))
            consumed = sum(
                max(int(q.get("committed_offset") or 0), 0)  # None: never
                for q in t.get("queues", [])
            )
            if is_retry_topic(name):
                out.retry_depth += lag
            else:
                out.lag += lag
                out.consumed += consumed
                out.topics[name] = {"lag": lag, "consumed": consumed}
        total = doc.get("total") or {}
        if "dlq_depth" in doc or "dlq_depth" in total:  # GroupProgress says it
            out.dlq_depth = int(
                doc.get("dlq_pending", doc.get("dlq_depth", total.get("dlq_depth", 0)))
            )
        else:
            out.dlq_depth = self.topic_depth(dlq_topic(group))
        if "retry_depth" in doc:
            out.retry_depth = int(doc["retry_depth"])
        return out

    # ------------------------------------------------------------------ messages
    def query(self, **params: object) -> dict[str, Any]:
        return dict(self.call("QueryMessage", **{k: v for k, v in params.items() if v is not None}))

    def trace(self, key: str) -> dict[str, Any]:
        return dict(self.call("TraceMessage", key=key))

    def reconsume(self, msg_id: str, group: str, operator: str) -> dict[str, Any]:
        return dict(self.call("ReconsumeMessage", id=msg_id, group=group, operator=operator))

    # ------------------------------------------------------------------ dead letters
    def dead_letters(self, group: str, limit: int = 100) -> dict[str, Any]:
        """`{messages: [{dlq_offset, msg_id, origin_topic, keys, replayed, ...}], more,
        depth, replayed, pending}`, oldest first."""
        return dict(self.call("ListDeadLetters", group=group, limit=limit))

    def replay(
        self,
        group: str,
        offsets: list[int],
        *,
        dry_run: bool,
        operator: str,
        run: str,
        to_topic: bool = False,
    ) -> dict[str, Any]:
        """Replay the dead letters at these `%DLQ%<group>` queue offsets (the broker skips,
        and says so, any replayed before)."""
        return dict(
            self.call(
                "ReplayDeadLetters",
                group=group,
                offsets=offsets,
                dry_run=dry_run,
                operator=operator,
                run=run,
                to_topic=to_topic,
            )
        )
