"""Calls refused for overload and calls their clients gave up on: counted, logged briefly.

Under a burst the server may fall behind its clients. Two things then happen, both normal:

- it **refuses** sends it cannot take in time, with `TOO_MANY_REQUESTS` in the response's
  status (the code a client backs off from): past `max_inflight_sends` messages being
  stored, or when a call is read with less than `min_send_time_ms` of its deadline left;
- clients **abandon** calls: a deadline passes, or a call is cancelled, before its answer
  leaves. The answer cannot be delivered; it is dropped, not sent. A send already admitted
  is still stored to its end and its result kept for the client's resend
  (`broker.server.detached`, `broker.server.producing`).

Each is a counter (`reliable_broker_refused_sends_total`,
`reliable_broker_abandoned_calls_total`, docs/observability.md) and at most one log line
per kind a minute (`broker.server.ratelimit`). gRPC's own log line for an answer to a call
its client already left (`ExecuteBatchError raised in core by servicer method`, with a
traceback, once per call) is caught by `CoreLogFilter` and counted the same way.
"""

from __future__ import annotations

import logging

from broker.server.ratelimit import LogLimiter

log = logging.getLogger(__name__)
# gRPC's server logs through this logger (its Cython core, `grpc._cython.cygrpc`)
GRPC_CORE_LOGGER = "grpc._cython.cygrpc"


class Overload:
    """The server's counts of refused sends and abandoned calls, and their log lines."""

    def __init__(self, limiter: LogLimiter | None = None) -> None:
        self.refused_sends = 0  # SendMessage calls answered TOO_MANY_REQUESTS for overload
        self.abandoned_calls = 0  # calls whose client left before their answer
        self._limited = limiter or LogLimiter(log)

    def refused(self, why: str) -> None:
        """One send refused with TOO_MANY_REQUESTS (`why`: what was full)."""
        self.refused_sends += 1
        self._limited.log(
            logging.WARNING,
            "refused",
            "refusing sends with TOO_MANY_REQUESTS: %s (counted in "
            "reliable_broker_refused_sends_total)",
            why,
        )

    def abandoned(self, rpc: str) -> None:
        """One call whose client gave up (deadline or cancel) before its answer left."""
        self.abandoned_calls += 1
        self._limited.log(
            logging.INFO,
            "abandoned",
            "a client gave up on a %s call before its answer (deadline passed or "
            "cancelled); its answer is dropped (counted in "
            "reliable_broker_abandoned_calls_total)",
            rpc,
        )


class CoreLogFilter(logging.Filter):
    """Installed on gRPC's core logger: its traceback for an answer that could not be sent
    to a client that already left becomes a count and a rate-limited line; every other
    record passes."""

    def __init__(self, overload: Overload) -> None:
        super().__init__()
        self.overload = overload
        try:  # gRPC's own exception for a failed batch of call operations
            from grpc._cython.cygrpc import ExecuteBatchError
        except ImportError:  # another gRPC build: nothing to recognise
            self._batch_error: type[BaseException] | None = None
        else:
            self._batch_error = ExecuteBatchError

    def filter(self, record: logging.LogRecord) -> bool:
        batch_error = self._batch_error
        exc = record.exc_info[1] if record.exc_info else None
        if batch_error is not None and isinstance(exc, batch_error):
            self.overload.abandoned("gRPC")
            return False
        return True

    def install(self) -> None:
        logging.getLogger(GRPC_CORE_LOGGER).addFilter(self)

    def uninstall(self) -> None:
        logging.getLogger(GRPC_CORE_LOGGER).removeFilter(self)
