"""The master's side: a listener on the HA port, one connection (two threads) per slave.

Threads, not asyncio: every step is a blocking store call (reading the mapping, and on the
slave writing it and waiting for an fsync) or a blocking socket call, there are one or two
slaves, not thousands, and the broker's store services are threads already; an event loop
would hand each store call to an executor and gain nothing.

Per slave, a writer thread sends whole records from the offset the slave reported, woken
by every append (the commitlog's `on_append` hook, chained only when a master role is
configured: a single broker does no extra work per message), and a reader thread takes the
slave's reports: its acknowledged offset, which the master keeps (`slaves()`).
"""

from __future__ import annotations

import contextlib
import enum
import heapq
import itertools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.errors import BrokerError, ResponseCode
from broker.ha.config import HaConfig
from broker.ha.errors import NotReplicated
from broker.ha.protocol import (
    CONFIG_FRAME,
    FRAME,
    HELLO,
    REPORT,
    HaProtocolError,
    recv_exact,
    unpack_hello,
)
from broker.store.store import MessageStore

log = logging.getLogger(__name__)


class AckOutcome(enum.Enum):
    """How a SYNC_MASTER wait for a slave's acknowledgement ended."""

    ACKED = "acked"  # a slave has the bytes (fsynced, when it flushes synchronously)
    SLAVE_NOT_AVAILABLE = "slave-not-available"  # no slave connected when the send came
    TIMEOUT = "flush-slave-timeout"  # no slave acknowledged within the timeout


# a SYNC_MASTER wait: (end, sequence, deadline, callback)
_Waiter = tuple[int, int, float, Callable[[AckOutcome], None]]


@dataclass
class SlaveState:
    """What the master knows of one connected slave."""

    address: str
    start_offset: int  # where its log ended when it connected
    acked_offset: int  # how far it reported having the log
    sent_offset: int  # how far the master has sent it
    connected_ms: int
    last_report_ms: int


class HaMaster:
    """Streams the commitlog to every connected slave; tracks their acknowledged offsets."""

    def __init__(self, store: MessageStore, config: HaConfig) -> None:
        self.store = store
        self.config = config
        self._server: socket.socket | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self._acked = threading.Condition(self._lock)
        self._conns: dict[int, _SlaveConnection] = {}
        self._next_id = 0
        self._threads: list[threading.Thread] = []
        self.port = 0
        # SYNC_MASTER waits: (end, sequence, deadline, callback), earliest end first
        self._waiters: list[_Waiter] = []
        self._sequence = itertools.count()
        self._reaper_wake = threading.Event()
        # topics, groups and offsets for the slaves (`Broker.config_snapshot`); None: none
        self.config_source: Callable[[], dict[str, Any]] | None = None

    # --- lifecycle
    def start(self) -> None:
        """Listen on the HA port and chain the append hook (the store is started)."""
        srv = socket.create_server((self.config.host, self.config.port), reuse_port=False)
        srv.settimeout(0.5)
        self._server = srv
        self.port = srv.getsockname()[1]
        previous = self.store.commitlog.on_append

        def on_append() -> None:
            if previous is not None:
                previous()
            for conn in list(self._conns.values()):
                conn.wake.set()

        self.store.commitlog.on_append = on_append
        for target, name in ((self._accept, "ha-accept"), (self._reap, "ha-timeouts")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info("replication: listening on %s:%d", self.config.host, self.port)

    def stop(self) -> None:
        self._stopped.set()
        if self._server is not None:
            self._server.close()
        for conn in list(self._conns.values()):
            conn.close()
        self._reaper_wake.set()
        for t in self._threads:
            t.join(5)
        with self._acked:
            self._acked.notify_all()
            waiters, self._waiters = self._waiters, []
        for *_, callback in waiters:
            callback(AckOutcome.TIMEOUT)

    # --- what the master knows
    def slaves(self) -> list[SlaveState]:
        with self._lock:
            return [SlaveState(**vars(c.state)) for c in self._conns.values()]

    def status(self) -> dict[str, Any]:
        """The admin service's `HaStatus` of a master: each slave's acknowledged offset
        and how many bytes of the log it lacks."""
        end = self.store.commitlog.get_max_offset()
        states = self.slaves()
        slaves: list[dict[str, Any]] = [
            {
                "address": s.address,
                "acked_offset": s.acked_offset,
                "sent_offset": s.sent_offset,
                "lag_bytes": max(end - s.acked_offset, 0),
                "connected_ms": s.connected_ms,
                "last_report_ms": s.last_report_ms,
            }
            for s in states
        ]
        return {
            "role": self.config.role.value,
            "broker_name": self.config.broker_name,
            "broker_id": self.config.broker_id,
            "ha_port": self.port,
            "max_offset": end,
            "slaves": slaves,
            "lag_bytes": min((max(end - s.acked_offset, 0) for s in states), default=None),
            "sync_timeout_ms": self.config.sync_timeout_ms,
        }

    def acked_offset(self) -> int:
        """The furthest offset any connected slave has acknowledged (-1: no slave)."""
        with self._lock:
            return max((c.state.acked_offset for c in self._conns.values()), default=-1)

    def wait_acked(self, end: int, timeout_s: float) -> bool:
        """True once a connected slave has acknowledged the log up to `end`."""
        deadline = time.monotonic() + timeout_s
        with self._acked:
            while True:
                if any(c.state.acked_offset >= end for c in self._conns.values()):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped.is_set():
                    return False
                self._acked.wait(left)

    def when_acked(self, end: int, timeout_ms: int, callback: Callable[[AckOutcome], None]) -> None:
        """SYNC_MASTER: `callback(ACKED)` once a slave acknowledges the log up to `end`;
        `SLAVE_NOT_AVAILABLE` at once when no slave is connected; `TIMEOUT` when none
        acknowledged within `timeout_ms`. Called on a replication thread (or this one):
        keep it short."""
        with self._lock:
            if not self._conns:
                outcome = AckOutcome.SLAVE_NOT_AVAILABLE
            elif any(c.state.acked_offset >= end for c in self._conns.values()):
                outcome = AckOutcome.ACKED
            else:
                deadline = time.monotonic() + timeout_ms / 1000
                first = not self._waiters or deadline < min(w[2] for w in self._waiters)
                heapq.heappush(self._waiters, (end, next(self._sequence), deadline, callback))
                if first:
                    self._reaper_wake.set()
                return
        callback(outcome)

    def _release(self, acked: int) -> None:
        """Answer every wait up to `acked` (called with the lock held; calls after)."""
        done = []
        while self._waiters and self._waiters[0][0] <= acked:
            done.append(heapq.heappop(self._waiters)[3])
        if done:
            self._lock.release()
            try:
                for callback in done:
                    callback(AckOutcome.ACKED)
            finally:
                self._lock.acquire()

    def _reap(self) -> None:
        """Answer the waits whose timeout passed."""
        while not self._stopped.is_set():
            now = time.monotonic()
            expired: list[_Waiter] = []
            with self._lock:
                kept: list[_Waiter] = []
                for w in self._waiters:
                    (expired if w[2] <= now else kept).append(w)
                if expired:
                    heapq.heapify(kept)
                    self._waiters = kept
                next_at = min((w[2] for w in self._waiters), default=now + 1.0)
            for *_, callback in expired:
                callback(AckOutcome.TIMEOUT)
            self._reaper_wake.wait(max(next_at - time.monotonic(), 0.001))
            self._reaper_wake.clear()

    def when_replicated(self, end: int, callback: Callable[[BrokerError | None], None]) -> None:
        """The server's SYNC_MASTER gate (`broker.server.context.SyncReplication`):
        `callback(None)` once a slave has the log up to `end`, else the error to answer."""
        timeout_ms = self.config.sync_timeout_ms

        def done(outcome: AckOutcome) -> None:
            if outcome is AckOutcome.ACKED:
                callback(None)
            elif outcome is AckOutcome.SLAVE_NOT_AVAILABLE:
                callback(NotReplicated(ResponseCode.SLAVE_NOT_AVAILABLE, "no slave is connected"))
            else:
                callback(
                    NotReplicated(
                        ResponseCode.FLUSH_SLAVE_TIMEOUT,
                        f"no slave acknowledged within {timeout_ms} ms",
                    )
                )

        self.when_acked(end, timeout_ms, done)

    # --- connections
    def _accept(self) -> None:
        srv = self._server
        assert srv is not None
        while not self._stopped.is_set():
            try:
                sock, addr = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(
                target=self._serve,
                args=(sock, f"{addr[0]}:{addr[1]}"),
                name="ha-slave",
                daemon=True,
            )
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, sock: socket.socket, address: str) -> None:
        cfg = self.config
        try:
            sock.settimeout(cfg.idle_timeout_ms / 1000)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            offset = unpack_hello(recv_exact(sock, HELLO.size))
            start = self._start_offset(offset)
        except (HaProtocolError, OSError) as exc:
            log.warning("replication: slave %s refused: %s", address, exc)
            sock.close()
            return
        now = int(time.time() * 1000)
        state = SlaveState(address, offset, offset, start, now, now)
        conn = _SlaveConnection(sock, state)
        with self._lock:
            key = self._next_id
            self._next_id += 1
            self._conns[key] = conn
        log.info(
            "replication: slave %s connected, its log ends at %d; sending from %d",
            address,
            offset,
            start,
        )
        reader = threading.Thread(
            target=self._read_reports, args=(conn,), name="ha-reports", daemon=True
        )
        reader.start()
        try:
            self._write(conn, start)
        except (HaProtocolError, OSError) as exc:
            if not self._stopped.is_set():
                log.warning("replication: slave %s dropped: %s", address, exc)
        finally:
            conn.close()
            reader.join(5)
            with self._acked:
                self._conns.pop(key, None)
                self._acked.notify_all()

    def _start_offset(self, offset: int) -> int:
        """Where to send from, for a slave whose log ends at `offset`."""
        log_ = self.store.commitlog
        end = log_.get_max_offset()
        if offset > end:
            raise HaProtocolError(
                f"the slave's log ends at {offset}, beyond this master's "
                f"({end}): it holds records this master never had"
            )
        low = log_.get_min_offset()
        if offset == 0 and low > 0:
            return low  # a new slave of a master whose first files were cleaned up
        if 0 <= offset < low:
            raise HaProtocolError(
                f"the slave's log ends at {offset}, before this master's "
                f"first record ({low}): start it from an empty store"
            )
        return offset

    def _write(self, conn: _SlaveConnection, offset: int) -> None:
        cfg = self.config
        heartbeat_s = cfg.heartbeat_ms / 1000
        store = self.store
        config_due = 0.0  # at once: a slave gets the configuration as it connects
        while not self._stopped.is_set() and not conn.closed:
            if self.config_source is not None and time.monotonic() >= config_due:
                body = json.dumps(self.config_source(), separators=(",", ":")).encode()
                conn.sock.sendall(FRAME.pack(CONFIG_FRAME, len(body)) + body)
                config_due = time.monotonic() + cfg.config_sync_ms / 1000
            conn.wake.clear()
            data = store.read_replica(offset, cfg.max_chunk_bytes)
            if data:
                conn.sock.sendall(FRAME.pack(offset, len(data)) + data)
                offset += len(data)
                conn.state.sent_offset = offset
                continue
            if not conn.wake.wait(heartbeat_s):
                conn.sock.sendall(FRAME.pack(store.commitlog.get_max_offset(), 0))

    def _read_reports(self, conn: _SlaveConnection) -> None:
        try:
            while not conn.closed:
                (offset,) = REPORT.unpack(recv_exact(conn.sock, REPORT.size))
                with self._acked:
                    conn.state.acked_offset = max(conn.state.acked_offset, offset)
                    conn.state.last_report_ms = int(time.time() * 1000)
                    self._acked.notify_all()
                    if self._waiters:
                        self._release(conn.state.acked_offset)
        except (HaProtocolError, OSError, ValueError):
            pass
        finally:
            conn.close()


class _SlaveConnection:
    def __init__(self, sock: socket.socket, state: SlaveState) -> None:
        self.sock = sock
        self.state = state
        self.wake = threading.Event()
        self.closed = False

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.wake.set()
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
