"""A small typed client of etcd's v3 API, over its JSON gRPC gateway (HTTP/1.1).

What automatic failover needs of etcd (docs/ha.md, "Automatic failover") is six calls:
`/v3/lease/grant`, `/v3/lease/keepalive` (one request, one answer: the gateway maps a
single JSON body onto the streaming call), `/v3/lease/revoke`, `/v3/kv/range`,
`/v3/kv/put` and `/v3/kv/txn` (a compare-and-set on a key's `mod_revision`). The gateway
is part of every etcd v3 server (3.4 serves it under `/v3/`), so this needs no gRPC stubs
of etcd's and no client library: the PyPI clients are either unmaintained (`etcd3`, pinned
to old protobuf and grpcio releases this project has long passed) or asyncio-only
(`aetcd`), while the replication code is threads. Keys and values are bytes, base64 in
the JSON, as etcd's gateway wants; 64-bit integers arrive as strings.

Every call has a timeout, runs on the calling thread over its own connection (one per
thread, kept), and raises `CoordinatorUnavailable` when etcd does not answer, so a caller
decides what "etcd is down" means for it (a master stops acknowledging once its lease
can no longer be renewed; a slave does not campaign).

TLS (`etcds://HOST:PORT` or `https://`): the server's certificate is verified against
`ca_file` (else the system's CAs) and its name against HOST; with `cert_file` and
`key_file` the client presents its certificate, as an etcd started with
`--client-cert-auth` demands (etcd's recommended way to authenticate its clients). A
refused handshake is `CoordinatorUnavailable` with the reason.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from broker.errors import BrokerError


class CoordinatorUnavailable(BrokerError):
    """etcd did not answer (down, unreachable, or it answered an error)."""


@dataclass(frozen=True)
class KeyValue:
    """One key as etcd holds it."""

    key: bytes
    value: bytes
    mod_revision: int
    version: int  # 0: the key does not exist
    lease: int  # 0: no lease


@dataclass(frozen=True)
class Compare:
    """A txn condition: `key`'s mod revision equals `mod_revision` (0: the key is absent)."""

    key: bytes
    mod_revision: int


@dataclass(frozen=True)
class Put:
    """A txn operation: put `value` at `key`, attached to `lease` (0: none)."""

    key: bytes
    value: bytes
    lease: int = 0


PLAIN_SCHEMES = ("etcd", "http")
TLS_SCHEMES = ("etcds", "https")


def parse_endpoint(url: str) -> tuple[str, int]:
    """`etcd://HOST:PORT` (or `http://`), `etcds://HOST:PORT` (or `https://`, TLS) ->
    (HOST, PORT); ValueError otherwise."""
    parts = urlsplit(url)
    schemes = PLAIN_SCHEMES + TLS_SCHEMES
    if parts.scheme not in schemes or not parts.hostname or parts.port is None:
        raise ValueError(f"{url!r} is not etcd://HOST:PORT or etcds://HOST:PORT")
    if parts.path not in ("", "/"):
        raise ValueError(f"{url!r}: no path after HOST:PORT")
    return parts.hostname, parts.port


def uses_tls(url: str) -> bool:
    return urlsplit(url).scheme in TLS_SCHEMES


def tls_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """The client's TLS context: etcd's certificate verified against `ca_file` (else the
    system's CAs), this client's own certificate presented when given. ValueError for a
    file that cannot be read or a certificate without its key."""
    if (cert_file is None) != (key_file is None):
        raise ValueError("a client certificate needs its key, and a key its certificate")
    try:
        context = ssl.create_default_context(cafile=ca_file)
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load the coordinator's TLS files: {exc}") from None
    return context


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


class EtcdClient:
    """etcd's KV and lease calls (see the module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        timeout_s: float = 1.0,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.tls = tls
        self._local = threading.local()

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        timeout_s: float = 1.0,
        ca_file: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
    ) -> EtcdClient:
        """A client of the etcd at `url`; TLS files only with `etcds://` (ValueError)."""
        host, port = parse_endpoint(url)
        if not uses_tls(url):
            if ca_file or cert_file or key_file:
                raise ValueError(f"TLS files given for a plaintext coordinator {url!r}")
            return cls(host, port, timeout_s=timeout_s)
        return cls(host, port, timeout_s=timeout_s, tls=tls_context(ca_file, cert_file, key_file))

    def _connect(self) -> http.client.HTTPConnection:
        if self.tls is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        return http.client.HTTPSConnection(
            self.host, self.port, timeout=self.timeout_s, context=self.tls
        )

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        # a kept connection etcd closed (a restart) fails at once: one more try on a new one
        for fresh in (conn is None, True):
            if conn is None or fresh:
                if conn is not None:
                    conn.close()
                conn = self._connect()
                self._local.conn = conn
            try:
                conn.request("POST", path, data, {"Content-Type": "application/json"})
                response = conn.getresponse()
                raw = response.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                self._local.conn = None
                if fresh:
                    raise CoordinatorUnavailable(
                        f"etcd at {self.host}:{self.port}: {exc or type(exc).__name__}"
                    ) from None
        if response.status != 200:
            raise CoordinatorUnavailable(
                f"etcd at {self.host}:{self.port} answered {path} with {response.status}: "
                f"{raw[:200]!r}"
            )
        try:
            answer = json.loads(raw)
        except ValueError:
            raise CoordinatorUnavailable(f"etcd answered {path} with no JSON") from None
        if not isinstance(answer, dict):
            raise CoordinatorUnavailable(f"etcd answered {path} with {answer!r:.80}")
        return answer

    # --- leases
    def grant(self, ttl_s: int) -> tuple[int, int]:
        """A new lease: (its id, its TTL in seconds, as etcd granted it)."""
        answer = self._call("/v3/lease/grant", {"TTL": ttl_s})
        return int(answer["ID"]), int(answer.get("TTL", 0))

    def keepalive(self, lease: int) -> int:
        """Renew `lease`: its TTL from now, in seconds; 0 when it has expired (or never was)."""
        answer = self._call("/v3/lease/keepalive", {"ID": str(lease)})
        result = answer.get("result", {})
        return int(result.get("TTL", 0)) if isinstance(result, dict) else 0

    def revoke(self, lease: int) -> None:
        """End `lease` now (its keys are deleted)."""
        self._call("/v3/lease/revoke", {"ID": str(lease)})

    # --- keys
    def get(self, key: bytes) -> KeyValue | None:
        kvs = self._range({"key": _b64(key)})
        return kvs[0] if kvs else None

    def get_prefix(self, prefix: bytes) -> list[KeyValue]:
        end = bytearray(prefix)
        end[-1] += 1  # the prefix's range end (no key prefix here ends in 0xff)
        return self._range({"key": _b64(prefix), "range_end": _b64(bytes(end))})

    def _range(self, body: dict[str, Any]) -> list[KeyValue]:
        answer = self._call("/v3/kv/range", body)
        return [
            KeyValue(
                key=_unb64(kv.get("key")),
                value=_unb64(kv.get("value")),
                mod_revision=int(kv.get("mod_revision", 0)),
                version=int(kv.get("version", 0)),
                lease=int(kv.get("lease", 0)),
            )
            for kv in answer.get("kvs", [])
        ]

    def put(self, key: bytes, value: bytes, *, lease: int = 0) -> None:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        self._call("/v3/kv/put", body)

    def txn(self, compare: list[Compare], success: list[Put]) -> bool:
        """Apply `success` atomically iff every comparison holds; True when it did."""
        body = {
            "compare": [
                {
                    "key": _b64(c.key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": str(c.mod_revision),
                }
                for c in compare
            ],
            "success": [
                {
                    "request_put": {
                        "key": _b64(p.key),
                        "value": _b64(p.value),
                        **({"lease": str(p.lease)} if p.lease else {}),
                    }
                }
                for p in success
            ],
        }
        return bool(self._call("/v3/kv/txn", body).get("succeeded", False))

    def delete_if(self, key: bytes, mod_revision: int) -> bool:
        """Delete `key` iff its mod revision is still `mod_revision`; True when it did."""
        body = {
            "compare": [
                {
                    "key": _b64(key),
                    "target": "MOD",
                    "result": "EQUAL",
                    "mod_revision": str(mod_revision),
                }
            ],
            "success": [{"request_delete_range": {"key": _b64(key)}}],
        }
        return bool(self._call("/v3/kv/txn", body).get("succeeded", False))
