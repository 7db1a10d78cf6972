"""Observability options shared by the long-running commands: `--metrics-port`,
`--metrics-host`, `--log-format`.

    add_arguments(parser)                      # in a command's register()
    endpoint = start_endpoint(args, "reliable broker", registry, ready)   # None without a port

`reliable broker start`, `reliable consume` and `reliable worker resend` use it; any other
long-running command (a console, ...) adds the same options with `add_arguments` and gets
the same endpoint and log format. `reliable_cli.main` configures logging from
`--log-format` before the command runs (see `configure_logging`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from reliable.logs import LOG_FORMATS, log_formatter

if TYPE_CHECKING:  # the endpoint and prometheus_client load only when a port is given
    from prometheus_client import CollectorRegistry

    from reliable.endpoint import MetricsEndpoint, ReadyChecks

HEALTH_TIMEOUT_S = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        metavar="PORT",
        help="serve /metrics (Prometheus), /healthz and /readyz on this port "
        "(0 picks a free one; default: no endpoint)",
    )
    parser.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address of the metrics endpoint (default 127.0.0.1; 0.0.0.0 for all)",
    )
    parser.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default="text",
        help="text (default) or json: one JSON object per line on stderr "
        "(time, level, logger, message and extra fields)",
    )


def configure_logging(level: int, log_format: str) -> None:
    """Root logging on stderr at `level`, in `log_format` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(log_formatter(log_format))
    logging.basicConfig(level=level, handlers=[handler], force=True)


def start_endpoint(
    args: argparse.Namespace, command: str, registry: CollectorRegistry, ready: ReadyChecks
) -> MetricsEndpoint | None:
    """Start the endpoint when `--metrics-port` was given, and say where on stdout:

    <command>: metrics on http://HOST:PORT/metrics
    """
    if args.metrics_port is None:
        return None
    from prometheus_client import GC_COLLECTOR, PLATFORM_COLLECTOR, PROCESS_COLLECTOR

    from reliable.endpoint import MetricsEndpoint

    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)  # process_* and python_* families, as exporters do
    endpoint = MetricsEndpoint(
        args.metrics_port, host=args.metrics_host, registry=registry, ready=ready
    )
    print(f"{command}: metrics on {endpoint.url}/metrics", flush=True)
    return endpoint


def stderr_notice(command: str, args: argparse.Namespace) -> Callable[[str], None]:
    """How a running command tells the operator something on stderr: `<command>: line` as
    text, or a WARNING record of logger `reliable.<command>` with `--log-format json`, so
    that stderr stays one JSON object per line."""
    if getattr(args, "log_format", "text") == "json":
        logger = logging.getLogger(command.replace("reliable ", "reliable.").replace(" ", "."))
        return logger.warning

    def say(line: str) -> None:
        print(f"{command}: {line}", file=sys.stderr, flush=True)

    return say


class BrokerProbe:
    """Asks a gRPC endpoint's standard health service whether it serves (one channel,
    reused). A server without the service (UNIMPLEMENTED) answered, so it counts as up."""

    def __init__(self, endpoint: str) -> None:
        import grpc

        self._channel = grpc.insecure_channel(endpoint)

    def __call__(self) -> bool:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        try:
            reply: Any = stub.Check(
                health_pb2.HealthCheckRequest(service=""), timeout=HEALTH_TIMEOUT_S
            )
        except grpc.RpcError as exc:
            return bool(exc.code() == grpc.StatusCode.UNIMPLEMENTED)
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def close(self) -> None:
        self._channel.close()


__all__ = ["BrokerProbe", "add_arguments", "configure_logging", "start_endpoint", "stderr_notice"]
