"""The master's side: a listener on the HA port, one connection (two threads) per slave.

Threads, not asyncio: every step is a blocking store call (reading the mapping, and on the
slave writing it and waiting for an fsync) or a blocking socket call, there are one or two
slaves, not thousands, and the broker's store services are threads already; an event loop
would hand each store call to an executor and gain nothing.

Per slave, a writer thread sends whole records from the offset the slave reported, woken
by every append (the commitlog's `on_any_append` hook, chained only when a master role is
configured: a single broker does no extra work per message), and a reader thread takes the
slave's reports: its acknowledged offset, which the master keeps (`slaves()`).
"""

from __future__ import annotations

import bisect
import contextlib
import enum
import heapq
import hmac
import itertools
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.errors import BrokerError, ResponseCode
from broker.ha.auth import RefusalLog, master_proof, nonce, secret_for, slave_proof
from broker.ha.config import HaConfig
from broker.ha.errors import NotReplicated
from broker.ha.link import TlsLink, server_context
from broker.ha.protocol import (
    ACTING_REPORT,
    CHALLENGE_FRAME,
    CONFIG_FRAME,
    FRAME,
    HELLO_PROBE,
    LAG,
    LAG_FRAME,
    LENGTH,
    MAX_ACTING_REPORT,
    NONCE,
    POSITION_FRAME,
    PROOF,
    PROOF_FRAME,
    REFUSED_HISTORY,
    REPORT,
    HaProtocolError,
    Hello,
    Link,
    VersionMismatch,
    read_hello,
    recv_exact,
    send_refusal,
)
from broker.ha.state import AckedCheckpoint, EpochHistory, epoch_end
from broker.store.store import MessageStore
from protocol.stats import Histogram

log = logging.getLogger(__name__)


class AckOutcome(enum.Enum):
    """How a SYNC_MASTER wait for a slave's acknowledgement ended."""

    ACKED = "acked"  # a slave has the bytes (fsynced, when it flushes synchronously)
    SLAVE_NOT_AVAILABLE = "slave-not-available"  # no slave connected when the send came
    TIMEOUT = "flush-slave-timeout"  # no slave acknowledged within the timeout


# a SYNC_MASTER wait: (end, sequence, deadline, callback)
_Waiter = tuple[int, int, float, Callable[[AckOutcome], None]]


COUNT_MARKS = 1 << 16  # appends remembered for counting a slave's lag in messages
WALK_LIMIT = 200_000  # records walked beyond them; further, the count is an estimate


@dataclass
class SlaveState:
    """What the master knows of one connected slave."""

    address: str
    broker_id: int
    start_offset: int  # where its log ended when it connected
    acked_offset: int  # how far it reported having the log
    sent_offset: int  # how far the master has sent it
    connected_ms: int
    last_report_ms: int


class _Refused(Exception):
    """A peer is refused at its handshake: `kind` and `why` for the log, `tell` for it."""

    def __init__(self, kind: str, why: str, tell: str | None = None) -> None:
        super().__init__(why)
        self.kind = kind
        self.why = why
        self.tell = tell


class HaMaster:
    """Streams the commitlog to every connected slave; tracks their acknowledged offsets."""

    def __init__(
        self,
        store: MessageStore,
        config: HaConfig,
        *,
        epochs: EpochHistory | None = None,
        acked: AckedCheckpoint | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.epochs = epochs  # None: the whole log is epoch 1
        self.acked = acked  # None: the acknowledged offset is not kept on disk
        # SYNC_MASTER waits: how long each took, and how each ended
        self.sync_seconds = Histogram()
        self.sync_outcomes: dict[str, int] = {o.value: 0 for o in AckOutcome}
        self._stats_lock = threading.Lock()
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
        # takes what a slave acknowledged while acting for this master
        # (`Broker.merge_acting_offsets`); None: ignored
        self.acting_sink: Callable[[dict[str, Any]], int] | None = None
        # a slave was heard from since this master started (its acting report, if it had
        # one, is taken before): see `HaNode.reads_ready`
        self.heard_from_slave = threading.Event()
        self.started = time.monotonic()
        self.refusals = RefusalLog(log)  # each refused peer, once a minute per host and reason
        self._tls: ssl.SSLContext | None = None
        if config.tls_cert is not None and config.tls_key is not None:
            self._tls = server_context(config.tls_cert, config.tls_key)
        self._peers = 0  # connections held, handshakes included (at most max_peers)
        # with a coordinator (docs/ha.md, "Automatic failover"): True while this master's
        # lease is sure to hold; a send is acknowledged only then. None: no coordinator
        self.fence: Callable[[], bool] | None = None

    # --- lifecycle
    def start(self) -> None:
        """Listen on the HA port and chain the append hook (the store is started)."""
        srv = socket.create_server((self.config.host, self.config.port), reuse_port=False)
        srv.settimeout(0.5)
        self._server = srv
        self.port = srv.getsockname()[1]
        previous = self.store.commitlog.on_any_append

        def on_any_append() -> None:  # every record, also those that do not wake the dispatcher
            if previous is not None:
                previous()
            for conn in list(self._conns.values()):
                conn.wake.set()

        self.store.commitlog.on_any_append = on_any_append
        self.store.commitlog.keep_count_marks(COUNT_MARKS)
        for target, name in ((self._accept, "ha-accept"), (self._reap, "ha-timeouts")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        log.info(
            "replication: listening on %s:%d (%s, %s)",
            self.config.host,
            self.port,
            "TLS" if self._tls is not None else "plaintext",
            "access keys required" if self.config.authenticates else "no authentication",
        )

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
        if self.acked is not None:
            self.acked.close()

    # --- what the master knows
    def slaves(self) -> list[SlaveState]:
        with self._lock:
            return [SlaveState(**vars(c.state)) for c in self._conns.values()]

    def status(self) -> dict[str, Any]:
        """The admin service's `HaStatus` of a master: each slave's acknowledged offset
        and how many bytes of the log it lacks."""
        end = self.store.commitlog.get_max_offset()
        states = self.slaves()
        slaves: list[dict[str, Any]] = []
        for s in states:
            messages, exact = self.lag_messages(s.acked_offset)
            slaves.append(
                {
                    "address": s.address,
                    "broker_id": s.broker_id,
                    "acked_offset": s.acked_offset,
                    "sent_offset": s.sent_offset,
                    "lag_bytes": max(end - s.acked_offset, 0),
                    "lag_messages": messages,
                    "lag_messages_exact": exact,
                    "connected_ms": s.connected_ms,
                    "last_report_ms": s.last_report_ms,
                }
            )
        best = min(slaves, key=lambda x: x["lag_bytes"], default=None)
        return {
            "role": self.config.role.value,
            "broker_name": self.config.broker_name,
            "broker_id": self.config.broker_id,
            "ha_port": self.port,
            "max_offset": end,
            "slaves": slaves,
            "lag_bytes": best["lag_bytes"] if best else None,
            "lag_messages": best["lag_messages"] if best else None,
            "acked_checkpoint": self.acked.offset if self.acked is not None else None,
            "epochs": [list(e) for e in self.epochs.entries] if self.epochs else [[1, 0]],
            "sync_timeout_ms": self.config.sync_timeout_ms,
        }

    def lag_messages(self, offset: int) -> tuple[int, bool]:
        """(messages in the log from `offset` to its end, exact): counted from the
        appends this master remembers (`COUNT_MARKS`), walking record headers only for
        the part before them (at most `WALK_LIMIT` records; beyond, estimated from the
        average record size walked, and `exact` is False)."""
        cl = self.store.commitlog
        end = cl.get_max_offset()
        if offset >= end:
            return 0, True
        marks = list(cl.count_marks or ())
        if not marks:
            return self._walk(offset, end)
        last_end, last_count = marks[-1]
        after, exact_after = self._walk(last_end, end) if end > last_end else (0, True)
        ends = [m[0] for m in marks]
        i = bisect.bisect_right(ends, offset) - 1
        if i >= 0:  # a remembered append ended at or before `offset`
            mark_end, mark_count = marks[i]
            between, _ = self._walk(mark_end, offset)
            return max(last_count - mark_count - between, 0) + after, exact_after
        first_end, first_count = marks[0]
        before, exact_before = self._walk(offset, first_end)
        return before + (last_count - first_count) + after, exact_before and exact_after

    def _walk(self, start: int, end: int) -> tuple[int, bool]:
        count, stopped = self.store.commitlog.count_records(start, end, WALK_LIMIT)
        if stopped >= end:
            return count, True
        walked = max(stopped - start, 1)
        return count + int((end - stopped) * count / walked), False

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
        started = time.monotonic()

        def done(outcome: AckOutcome) -> None:
            with self._stats_lock:
                self.sync_seconds.observe(time.monotonic() - started)
                self.sync_outcomes[outcome.value] += 1
            callback(outcome)

        with self._lock:
            if not self._conns:
                outcome = AckOutcome.SLAVE_NOT_AVAILABLE
            elif any(c.state.acked_offset >= end for c in self._conns.values()):
                outcome = AckOutcome.ACKED
            else:
                deadline = time.monotonic() + timeout_ms / 1000
                first = not self._waiters or deadline < min(w[2] for w in self._waiters)
                heapq.heappush(self._waiters, (end, next(self._sequence), deadline, done))
                if first:
                    self._reaper_wake.set()
                return
        done(outcome)

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
            fence = self.fence
            if outcome is AckOutcome.ACKED and fence is not None and not fence():
                callback(fenced())
            elif outcome is AckOutcome.ACKED:
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
            address = f"{addr[0]}:{addr[1]}"
            with self._lock:
                full = self._peers >= self.config.max_peers
                if not full:
                    self._peers += 1
            if full:
                sock.close()
                self.refusals.refused(
                    address, "busy", f"{self.config.max_peers} connections held already"
                )
                continue
            t = threading.Thread(
                target=self._serve,
                args=(sock, address),
                name="ha-slave",
                daemon=True,
            )
            t.start()
            self._threads = [x for x in self._threads if x.is_alive()] + [t]

    def _serve(self, sock: socket.socket, address: str) -> None:
        try:
            self._serve_peer(sock, address)
        finally:
            with self._lock:
                self._peers -= 1

    def _serve_peer(self, raw: socket.socket, address: str) -> None:
        cfg = self.config
        sock: Link = raw
        try:
            raw.settimeout(cfg.handshake_timeout_ms / 1000)
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._tls is not None:
                link = TlsLink(raw, self._tls, server_side=True)
                try:
                    link.handshake()
                except ssl.SSLError as exc:
                    raise _Refused("tls", f"TLS handshake failed: {exc}") from None
                sock = link
            hello = self._handshake(sock)
            if hello.kind == HELLO_PROBE:
                self._send_position(sock, None)
                sock.close()
                return
            refused = self._refusal(hello.offset, hello.epoch)
            if refused is not None:
                self._send_position(sock, refused)
                raise _Refused("history", refused)
            start = self._start_offset(hello.offset)
            sock.settimeout(cfg.idle_timeout_ms / 1000)
        except _Refused as exc:
            self.refusals.refused(address, exc.kind, exc.why)
            if exc.tell is not None:
                send_refusal(sock, exc.tell, exc.kind)
            sock.close()
            return
        except (HaProtocolError, OSError, ssl.SSLError) as exc:
            self.refusals.refused(address, "protocol", str(exc) or type(exc).__name__)
            sock.close()
            return
        now = int(time.time() * 1000)
        offset, slave_id = hello.offset, hello.broker_id
        state = SlaveState(address, slave_id, offset, offset, start, now, now)
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
        except (HaProtocolError, OSError, ssl.SSLError) as exc:
            if not self._stopped.is_set() and not conn.violated:
                log.warning("replication: slave %s dropped: %s", address, exc)
        finally:
            conn.close()
            reader.join(5)
            with self._acked:
                self._conns.pop(key, None)
                self._acked.notify_all()

    def _handshake(self, sock: Link) -> Hello:
        """Read the peer's hello and, with access keys, check its proof and prove this
        master's (`broker.ha.auth`); `_Refused` when it may not replicate."""
        cfg = self.config
        try:
            hello = read_hello(sock)
        except VersionMismatch as exc:
            raise _Refused("version", str(exc), tell=str(exc)) from None
        secret = ""
        challenge = proof = b""
        if cfg.authenticates:
            key = hello.access_key
            if not key:
                raise _Refused(
                    "auth",
                    "it offered no access key",
                    tell="this master requires an access key (--credentials-file)",
                )
            secret, known = secret_for(cfg.credentials, key)
            challenge = nonce()
            sock.sendall(FRAME.pack(CHALLENGE_FRAME, NONCE) + challenge)
            proof = recv_exact(sock, PROOF)
            good = hmac.compare_digest(proof, slave_proof(secret, hello.raw, challenge))
            if not (good and known):
                why = "wrong proof for" if known else "unknown"
                raise _Refused(
                    "auth", f"{why} access key {key[:64]!r}", tell="authentication failed"
                )
        elif hello.access_key:
            raise _Refused(
                "auth",
                "it authenticates, and this master has no access keys",
                tell="this master has no access keys (--credentials-file) to prove itself with",
            )
        if hello.group != cfg.broker_name:
            why = (
                f"it is of broker group {hello.group[:64]!r}; this master is of {cfg.broker_name!r}"
            )
            raise _Refused("group", why, tell=why)
        if cfg.authenticates:
            mine = master_proof(secret, hello.raw, challenge, proof)
            sock.sendall(FRAME.pack(PROOF_FRAME, PROOF) + mine)
        return hello

    def _history(self) -> list[tuple[int, int]]:
        return self.epochs.entries if self.epochs is not None else [(1, 0)]

    def _send_position(self, sock: Link, refused: str | None) -> None:
        """The position frame: this log's ends and epochs (and why a slave is refused)."""
        cl = self.store.commitlog
        body: dict[str, Any] = {
            "max_offset": cl.get_max_offset(),
            "min_offset": cl.get_min_offset(),
            "epochs": [list(e) for e in self._history()],
        }
        if refused is not None:
            body["refused"] = refused
            body["reason"] = REFUSED_HISTORY
        data = json.dumps(body).encode()
        with contextlib.suppress(OSError):
            sock.sendall(FRAME.pack(POSITION_FRAME, len(data)) + data)

    def _refusal(self, offset: int, epoch: tuple[int, int]) -> str | None:
        """Why a slave whose log ends at `offset` in `epoch` cannot continue this log
        (None: it can): it holds records this master never had."""
        end = self.store.commitlog.get_max_offset()
        history = self._history()
        last = epoch_end(history, epoch, end)
        if last is None:
            return (
                f"the slave's last epoch {list(epoch)} is not in this master's history "
                f"{[list(e) for e in history]}: it must rejoin (docs/ha.md, Rejoining)"
            )
        if offset > last:
            return (
                f"the slave's log ends at {offset}, beyond {last}, where this master's "
                f"copy of epoch {epoch[0]} ends: it holds records this master never had; "
                "it must rejoin, cutting its log back (docs/ha.md, Rejoining)"
            )
        return None

    def _start_offset(self, offset: int) -> int:
        """Where to send from, for a slave whose log ends at `offset`."""
        log_ = self.store.commitlog
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
        lag_due = time.monotonic() + 1.0
        while not self._stopped.is_set() and not conn.closed:
            now = time.monotonic()
            if now >= config_due:
                snapshot = self.config_source() if self.config_source is not None else {}
                snapshot["epochs"] = [list(e) for e in self._history()]
                body = json.dumps(snapshot, separators=(",", ":")).encode()
                conn.sock.sendall(FRAME.pack(CONFIG_FRAME, len(body)) + body)
                config_due = time.monotonic() + cfg.config_sync_ms / 1000
            if now >= lag_due:
                lag, _ = self.lag_messages(conn.state.acked_offset)
                conn.sock.sendall(FRAME.pack(LAG_FRAME, LAG.size) + LAG.pack(lag))
                lag_due = now + 1.0
            conn.wake.clear()
            data = store.read_replica(offset, cfg.max_chunk_bytes)
            if data:
                offset += len(data)
                # before the bytes leave: the slave may report them before sendall returns
                conn.state.sent_offset = offset
                conn.sock.sendall(FRAME.pack(offset - len(data), len(data)) + data)
                continue
            if not conn.wake.wait(heartbeat_s):
                conn.sock.sendall(FRAME.pack(store.commitlog.get_max_offset(), 0))

    def _read_reports(self, conn: _SlaveConnection) -> None:
        try:
            while not conn.closed:
                (offset,) = REPORT.unpack(recv_exact(conn.sock, REPORT.size))
                if offset == ACTING_REPORT:
                    (length,) = LENGTH.unpack(recv_exact(conn.sock, LENGTH.size))
                    if length > MAX_ACTING_REPORT:
                        raise self._violation(
                            conn,
                            f"an acting report of {length} bytes (at most {MAX_ACTING_REPORT})",
                        )
                    self._take_acting(conn, recv_exact(conn.sock, length))
                    self.heard_from_slave.set()
                    continue
                if not 0 <= offset <= conn.state.sent_offset:
                    # it cannot have what it was not sent: nothing of this link counts
                    raise self._violation(
                        conn,
                        f"it reported having the log up to {offset}, but was sent it only "
                        f"up to {conn.state.sent_offset}",
                    )
                self.heard_from_slave.set()
                with self._acked:
                    conn.state.acked_offset = max(conn.state.acked_offset, offset)
                    if self.acked is not None:  # on disk before a send is answered
                        self.acked.advance(conn.state.acked_offset)
                    conn.state.last_report_ms = int(time.time() * 1000)
                    self._acked.notify_all()
                    if self._waiters:
                        self._release(conn.state.acked_offset)
        except (HaProtocolError, OSError, ValueError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def _violation(self, conn: _SlaveConnection, why: str) -> HaProtocolError:
        """A slave broke the protocol: logged (rate-limited), its link dropped."""
        conn.violated = True
        self.refusals.refused(conn.state.address, "violation", why)
        return HaProtocolError(why)

    def _take_acting(self, conn: _SlaveConnection, data: bytes) -> None:
        sink = self.acting_sink
        if sink is None:
            return
        try:
            report = json.loads(data)
            if not isinstance(report, dict):
                raise ValueError("not a JSON object")
            marked = sink(report)
        except Exception as exc:
            log.warning(
                "replication: slave %s's acting report not taken: %s", conn.state.address, exc
            )
            return
        log.info(
            "replication: slave %s acknowledged %d offsets while acting for this master; taken",
            conn.state.address,
            marked,
        )


def fenced() -> NotReplicated:
    """The answer of a master whose coordinator lease may be lost: not acknowledged (the
    producer retries, and finds the group's master)."""
    return NotReplicated(
        ResponseCode.SLAVE_NOT_AVAILABLE,
        "this master cannot renew its coordinator lease, so it acknowledges nothing "
        "(another broker may be the group's master by now)",
    )


class _SlaveConnection:
    def __init__(self, sock: Link, state: SlaveState) -> None:
        self.sock = sock
        self.state = state
        self.wake = threading.Event()
        self.closed = False
        self.violated = False  # dropped for a protocol violation (logged as one)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.wake.set()
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
