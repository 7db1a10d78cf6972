"""The HTTP endpoint of a long-running process: `/metrics`, `/healthz`, `/readyz`.

    from reliable.endpoint import serve_metrics
    endpoint = serve_metrics(9100, ready=lambda: {"broker": transport_connected()})
    ...
    endpoint.stop()

`/metrics` is the Prometheus text format of `registry` (default: prometheus_client's
global REGISTRY, where `reliable.metrics.register_client_metrics` puts the client's
collectors). `/healthz` answers 200 while the process serves HTTP at all. `/readyz` runs
the `ready` checks, each a name and a callable returning a bool (a check that raises counts
as failed, its error in the body): 200 when all pass, else 503. Both answer JSON:

    {"status": "ready", "checks": {"broker": {"ok": true}}}
    {"status": "not ready", "checks": {"database": {"ok": false, "error": "..."}}}

The server runs in daemon threads (`http.server.ThreadingHTTPServer`), so a slow scrape never
delays the process's own work more than the GIL does.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import choose_encoder

log = logging.getLogger(__name__)

ReadyChecks = Callable[[], Mapping[str, bool]]


def run_checks(ready: ReadyChecks | None) -> tuple[bool, dict[str, Any]]:
    """(all passed, per check {"ok": bool[, "error": str]}); no checks means ready."""
    if ready is None:
        return True, {}
    try:
        results = dict(ready())
    except Exception as exc:  # a check that cannot even run: not ready, say why
        return False, {"checks": {"ok": False, "error": f"{type(exc).__name__}: {exc}"}}
    checks: dict[str, Any] = {}
    for name, ok in results.items():
        checks[name] = {"ok": bool(ok)}
    return all(c["ok"] for c in checks.values()), checks


def check(fn: Callable[[], object]) -> Callable[[], bool]:
    """Wrap a probe that raises when unhealthy (a `SELECT 1`) as a check returning a bool;
    the failure is logged at DEBUG, once per probe, without a traceback."""

    def probe() -> bool:
        try:
            fn()
        except Exception as exc:
            log.debug("readiness probe failed: %s", exc)
            return False
        return True

    return probe


class MetricsEndpoint:
    """A started HTTP endpoint; `port` is the bound port (0 at construction picks one)."""

    def __init__(
        self,
        port: int,
        *,
        host: str = "127.0.0.1",
        registry: CollectorRegistry = REGISTRY,
        ready: ReadyChecks | None = None,
    ) -> None:
        self.registry = registry
        self.ready = ready
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("%s " + format, self.address_string(), *args)

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self.host = host
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()

    def _answer(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, content_type = choose_encoder(req.headers.get("Accept", ""))
            self._send(req, 200, encoder(self.registry), content_type)
        elif path == "/healthz":
            self._json(req, 200, {"status": "alive"})
        elif path == "/readyz":
            ok, checks = run_checks(self.ready)
            self._json(
                req,
                200 if ok else 503,
                {"status": "ready" if ok else "not ready", "checks": checks},
            )
        else:
            self._json(
                req,
                404,
                {"error": f"no such path {path!r}", "paths": ["/metrics", "/healthz", "/readyz"]},
            )

    def _json(self, req: BaseHTTPRequestHandler, code: int, body: Mapping[str, Any]) -> None:
        self._send(req, code, json.dumps(body).encode(), "application/json")

    @staticmethod
    def _send(req: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
        req.send_response(code)
        req.send_header("Content-Type", content_type)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve_metrics(
    port: int,
    *,
    host: str = "127.0.0.1",
    registry: CollectorRegistry = REGISTRY,
    ready: ReadyChecks | None = None,
) -> MetricsEndpoint:
    """Serve `/metrics`, `/healthz` and `/readyz` on `host:port` from background threads."""
    return MetricsEndpoint(port, host=host, registry=registry, ready=ready)


__all__ = ["MetricsEndpoint", "ReadyChecks", "check", "run_checks", "serve_metrics"]
