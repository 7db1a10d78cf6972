"""The slave's side: dial the master, write what it streams, report how far it has it.

One thread: connect, say where this commitlog ends (hello), then for each frame write
the records at the same offsets (`MessageStore.append_replica`, which checks each record
first), wait for the fsync when the store flushes synchronously, and report the new end.
A dropped link, a refused chunk or a master that is down: wait `reconnect_ms` and dial
again from wherever this log ends (the master resends from there).

A master that answers and refuses (a position frame saying why, `MasterRefused`):

- for this log's history (`history`: it holds records the master never had): the slave
  rejoins running (`rejoin`, set by `broker.ha.node`: the tail saved, the store cut back,
  broker/ha/rejoin.py) and dials again at once; a rejoin refused because the cut would
  lose acknowledged bytes is the operator's (logged once a minute, tried again every
  `PERMANENT_RETRY_S`);
- for what cannot change by itself (wrong group, access key, protocol version): logged
  once a minute, dialled again every `PERMANENT_RETRY_S`;
- otherwise, and when a rejoin cannot ask the master now: dialled again after a backoff
  (`REFUSED_BACKOFF`: 0.1 s doubling to 5 s), which a connection that gets through resets.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.ha.auth import RefusalLog, master_proof, nonce, slave_proof
from broker.ha.config import HaConfig
from broker.ha.errors import RejoinRefused
from broker.ha.link import TlsLink, client_context
from broker.ha.protocol import (
    ACTING_REPORT,
    CHALLENGE_FRAME,
    CONFIG_FRAME,
    HELLO_PROBE,
    HELLO_STREAM,
    LAG,
    LAG_FRAME,
    LENGTH,
    MAX_CONFIG,
    MAX_POSITION,
    NONCE,
    PERMANENT_REFUSALS,
    POSITION_FRAME,
    PROOF,
    PROOF_FRAME,
    REFUSED_HISTORY,
    REFUSED_OTHER,
    REPORT,
    HaProtocolError,
    Link,
    MasterRefused,
    pack_hello,
    recv_frame,
)
from broker.ha.state import EpochHistory, parse_epochs
from broker.store.config import FlushMode
from broker.store.errors import StoreError
from broker.store.store import MessageStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Waits that double from `first_s` up to `cap_s`: attempt 0 waits `first_s`."""

    first_s: float = 0.1
    cap_s: float = 5.0

    def delay(self, attempt: int) -> float:
        return float(min(self.first_s * 2 ** min(attempt, 62), self.cap_s))


REFUSED_BACKOFF = Backoff(0.1, 5.0)  # a refusal that may pass (module docstring)
PERMANENT_RETRY_S = 30.0  # a refusal that cannot pass by itself, and a refused rejoin


class HaSlave:
    """Keeps this store's commitlog a copy of the master's."""

    def __init__(
        self, store: MessageStore, config: HaConfig, *, epochs: EpochHistory | None = None
    ) -> None:
        if config.master is None and not config.coordinated:
            raise ValueError("a slave needs its master's address")
        self.store = store
        self.config = config
        self.epochs = epochs  # takes the master's history at config sync; None: epoch 1
        self.master_lag_messages = -1  # messages this slave lacks, as its master counted
        self.refused = ""  # why the master refused this slave last, if it did
        # its master's HA address; with a coordinator, None until one is named, and changed
        # by `follow` at each failover
        self.master: tuple[str, int] | None = config.master
        # the group's epoch, as the coordinator last named it: frames of a master of an
        # older epoch are refused (0: no coordinator, no such check)
        self.min_epoch = 0
        self._stopped = threading.Event()
        self._wake = threading.Event()  # dial now (a new master to follow, or a stop)
        self._sock: Link | None = None
        self._thread = threading.Thread(target=self._run, name="ha-slave", daemon=True)
        self.connected = False
        self.master_max_offset = -1  # the master's log end, from its last heartbeat/frame
        self.last_frame_ms = 0
        # takes the master's topics, groups and offsets (`Broker.apply_config_snapshot`)
        self.config_sink: Callable[[dict[str, Any]], None] | None = None
        self.config_synced_ms = 0  # when the last configuration was applied
        # what this slave acknowledged while acting for its master, None when nothing
        # (`Broker.acting_report`, which also ends the acting)
        self.acting_source: Callable[[], dict[str, Any] | None] | None = None
        # a master refused this log's history: cut it back to continue the master's
        # (`HaNode` sets it: broker/ha/rejoin.py); True when it cut or changed something,
        # False when nothing needed changing. None: such a refusal is only waited out
        self.rejoin: Callable[[tuple[str, int]], bool] | None = None
        self.rejoining = False  # a rejoin is under way (the link is down meanwhile)
        self.backoff = REFUSED_BACKOFF
        self.permanent_retry_s = PERMANENT_RETRY_S
        self._refused_in_a_row = 0  # refusals since the last connection that got through
        self._refusals = RefusalLog(
            log, said="replication: the master %s refused this slave (%s): %s%s"
        )

    def start(self) -> None:
        self._thread.start()

    def status(self) -> dict[str, Any]:
        """The admin service's `HaStatus` of a slave: how far behind its master it is
        (as of the master's last frame or heartbeat)."""
        end = self.store.get_commitlog_max_offset()
        known = self.master_max_offset
        lag = max(known - end, 0) if known >= 0 else None
        messages = 0 if lag == 0 else (self.master_lag_messages if lag is not None else None)
        return {
            "role": "slave",
            "broker_name": self.config.broker_name,
            "broker_id": self.config.broker_id,
            "master": f"{self.master[0]}:{self.master[1]}" if self.master else None,
            "connected": self.connected,
            "max_offset": end,
            "master_max_offset": known,
            "lag_bytes": lag,
            "lag_messages": messages if messages is None or messages >= 0 else None,
            "last_frame_ms": self.last_frame_ms,
            "config_synced_ms": self.config_synced_ms,
            "epochs": [list(e) for e in self.epochs.entries] if self.epochs else [[1, 0]],
            "refused": self.refused or None,
        }

    def master_alive(self) -> bool:
        """Connected to its master, and heard from it within the idle timeout."""
        recent = time.time() * 1000 - self.last_frame_ms < self.config.idle_timeout_ms
        return self.connected and recent

    def follow(self, master: tuple[str, int], epoch: int) -> None:
        """Replicate from `master`, the group's master in `epoch` (its coordinator says):
        a link to another master is dropped, and frames of an older epoch are refused."""
        self.min_epoch = max(self.min_epoch, epoch)
        if master != self.master:
            log.warning(
                "replication: following %s:%d, the group's master in epoch %d", *master, epoch
            )
            self.master = master
            self.master_max_offset = -1  # the new master's end is unknown until it says
            self._drop()
            self._wake.set()

    def _drop(self) -> None:
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stopped.is_set():
            wait_s = self.config.reconnect_ms / 1000
            try:
                self._session()
            except StaleMaster as exc:
                # a master just promoted may not have begun its epoch yet: ask again soon
                wait_s = min(wait_s, 0.1)
                log.info("replication: %s; dialling again in %.1f s", exc, wait_s)
            except MasterRefused as exc:
                if not self._stopped.is_set():
                    wait_s = self._after_refusal(exc)
            except (HaProtocolError, OSError, StoreError) as exc:
                if not self._stopped.is_set():
                    log.warning(
                        "replication from %s: %s; dialling again in %.1f s",
                        _address(self.master),
                        exc,
                        wait_s,
                    )
            finally:
                self.connected = False
                sock, self._sock = self._sock, None
                if sock is not None:
                    sock.close()
            self._wake.wait(wait_s)
            self._wake.clear()

    def _after_refusal(self, exc: MasterRefused) -> float:
        """What to do about a master's refusal (module docstring): how long to wait
        before dialling again."""
        master = self.master
        address = _address(master)
        if exc.reason in PERMANENT_REFUSALS:
            self._refusals.refused(address, exc.reason, exc.why)
            return self.permanent_retry_s
        attempt = self._refused_in_a_row
        self._refused_in_a_row += 1
        if exc.reason != REFUSED_HISTORY or self.rejoin is None or master is None:
            wait_s = self.backoff.delay(attempt)
            log.info("replication: %s; dialling again in %.1f s", exc, wait_s)
            return wait_s
        self.rejoining = True
        try:
            changed = self.rejoin(master)
        except RejoinRefused as err:
            self._refusals.refused(address, "rejoin", f"cannot rejoin as a slave: {err}")
            return self.permanent_retry_s
        except (HaProtocolError, OSError, ssl.SSLError, StoreError, ValueError) as err:
            wait_s = self.backoff.delay(attempt)
            log.info(
                "replication: %s; cannot rejoin now (%s); trying again in %.1f s",
                exc,
                err,
                wait_s,
            )
            return wait_s
        finally:
            self.rejoining = False
        if changed:
            return 0.0  # dial at once, from the log's new end
        wait_s = self.backoff.delay(attempt)
        log.info("replication: %s; nothing to cut; dialling again in %.1f s", exc, wait_s)
        return wait_s

    def _apply_config(self, data: bytes) -> None:
        """Take the master's configuration; a bad one is logged and skipped (the log
        copy goes on, the next one comes in `config_sync_ms`)."""
        sink = self.config_sink or (lambda _snapshot: None)
        try:
            snapshot = json.loads(data)
            if not isinstance(snapshot, dict):
                raise ValueError("not a JSON object")
            epochs = snapshot.pop("epochs", None)
            if epochs is not None and self.epochs is not None:
                self.epochs.replace(parse_epochs(epochs))
            sink(snapshot)
        except Exception as exc:
            log.warning("replication: the master's configuration was not applied: %s", exc)
            return
        self.config_synced_ms = int(time.time() * 1000)

    def _report_acting(self, sock: Link) -> None:
        source = self.acting_source
        report = source() if source is not None else None
        if report is None:
            return
        body = json.dumps(report, separators=(",", ":")).encode()
        sock.sendall(REPORT.pack(ACTING_REPORT) + LENGTH.pack(len(body)) + body)
        log.info("replication: reported the offsets acknowledged while acting for the master")

    def _session(self) -> None:
        cfg = self.config
        store = self.store
        master = self.master
        if master is None:  # no master named yet (a coordinator names one)
            return
        end = store.get_commitlog_max_offset()
        epoch = self.epochs.last if self.epochs is not None else (1, 0)
        try:
            sock = dial(cfg, master, end, epoch, on_socket=self._keep)
        except MasterRefused as exc:
            self.refused = exc.why
            raise
        if self._stopped.is_set() or master != self.master:
            return
        self._refused_in_a_row = 0
        self.connected = True
        log.info("replication: connected to %s:%d, this log ends at %d", *master, end)
        self._report_acting(sock)
        sync = store.config.flush_mode is FlushMode.SYNC_FLUSH
        heartbeat_s = cfg.heartbeat_ms / 1000
        last_report = time.monotonic()
        # a frame of records is at most one commitlog file: a longer length is not a frame
        limits = {CONFIG_FRAME: MAX_CONFIG, POSITION_FRAME: MAX_POSITION, LAG_FRAME: LAG.size}
        records = store.config.mapped_file_size_commitlog
        # the master's epoch: the last of the history its config frame (always its first)
        # carries; every frame after it is checked against the group's epoch
        master_epoch = 0
        while not self._stopped.is_set():
            offset, data = recv_frame(sock, limits, records)
            if offset == CONFIG_FRAME:
                master_epoch = _last_epoch(data, master_epoch)
            if master_epoch < self.min_epoch and offset != POSITION_FRAME:
                raise StaleMaster(
                    f"the master at {master[0]}:{master[1]} is of epoch {master_epoch}, "
                    f"the group is in epoch {self.min_epoch}: its frames are refused"
                )
            self.last_frame_ms = int(time.time() * 1000)
            if not data and offset >= 0:  # a heartbeat: the master's log end
                self.master_max_offset = offset
                if time.monotonic() - last_report >= heartbeat_s / 2:
                    sock.sendall(REPORT.pack(store.get_commitlog_max_offset()))
                    last_report = time.monotonic()
                continue
            if offset == CONFIG_FRAME:
                self._apply_config(data)
                self._report_acting(sock)  # again while the master's offsets lack some
                continue
            if offset == LAG_FRAME:
                (self.master_lag_messages,) = LAG.unpack(data)
                continue
            if offset == POSITION_FRAME:  # refused: this log does not continue the master's
                self.connected = False
                why, reason = _refusal_of(data)
                self.refused = why
                raise MasterRefused(why, reason)
            if offset < 0:
                raise HaProtocolError(f"an unknown frame (offset {offset})")
            self.refused = ""
            end = store.append_replica(offset, data)
            self.master_max_offset = max(self.master_max_offset, end)
            if sync and not store.commitlog.wait_flushed(end):
                raise HaProtocolError(f"this store did not fsync up to {end} in time")
            sock.sendall(REPORT.pack(end))
            last_report = time.monotonic()

    def _keep(self, sock: socket.socket) -> None:
        self._sock = sock  # stop() shuts it down, mid-handshake too


class StaleMaster(HaProtocolError):
    """The master dialled is of an older epoch than the one its coordinator names."""


def _address(master: tuple[str, int] | None) -> str:
    return f"{master[0]}:{master[1]}" if master else "(no master yet)"


def _last_epoch(config: bytes, otherwise: int) -> int:
    """The last epoch of the history a config frame carries (`otherwise` without one)."""
    try:
        history = parse_epochs(json.loads(config).get("epochs"))
    except (ValueError, AttributeError):
        return otherwise
    return history[-1][0]


def _refusal_of(data: bytes) -> tuple[str, str]:
    """Why a position frame refuses this slave, and the reason in one word."""
    try:
        body = json.loads(data)
    except ValueError:
        return "refused", REFUSED_OTHER
    if not isinstance(body, dict):
        return "refused", REFUSED_OTHER
    return str(body.get("refused", "refused")), str(body.get("reason", REFUSED_OTHER))


def dial(
    config: HaConfig,
    master: tuple[str, int],
    end: int,
    epoch: tuple[int, int],
    *,
    kind: int = HELLO_STREAM,
    timeout_s: float | None = None,
    on_socket: Callable[[socket.socket], None] | None = None,
) -> Link:
    """Connect to `master`, over TLS when `config.tls_ca` is set, say hello, and with
    an access key prove it and check the master's proof (`broker.ha.auth`). The link,
    ready for the master's frames; HaProtocolError (the master's refusal, or a master
    that did not prove itself), ssl.SSLError or OSError when it cannot."""
    timeout = timeout_s if timeout_s is not None else config.idle_timeout_ms / 1000
    raw = socket.create_connection(master, timeout=timeout)
    if on_socket is not None:
        on_socket(raw)
    sock: Link = raw
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if config.tls_ca is not None:
            link = TlsLink(
                raw, client_context(config.tls_ca), server_side=False, server_hostname=master[0]
            )
            link.handshake()
            sock = link
        key = config.access_key
        hello = pack_hello(
            end,
            broker_id=config.broker_id,
            epoch=epoch,
            kind=kind,
            group=config.broker_name,
            access_key=key or "",
            nonce=nonce(),
        )
        sock.sendall(hello)
        if key is not None:
            secret = config.credentials[key]
            offset, data = recv_frame(
                sock, {CHALLENGE_FRAME: NONCE, POSITION_FRAME: MAX_POSITION}, 0
            )
            if offset == POSITION_FRAME:
                raise MasterRefused(*_refusal_of(data))
            if offset != CHALLENGE_FRAME or len(data) != NONCE:
                raise HaProtocolError("the master did not ask this slave to authenticate")
            mine = slave_proof(secret, hello, data)
            sock.sendall(mine)
            offset, proof = recv_frame(sock, {PROOF_FRAME: PROOF, POSITION_FRAME: MAX_POSITION}, 0)
            if offset == POSITION_FRAME:
                raise MasterRefused(*_refusal_of(proof))
            expected = master_proof(secret, hello, data, mine)
            if offset != PROOF_FRAME or not hmac.compare_digest(proof, expected):
                raise HaProtocolError(
                    f"the master at {master[0]}:{master[1]} did not prove it holds access "
                    f"key {key!r}: not this group's master"
                )
        sock.settimeout(config.idle_timeout_ms / 1000)
        return sock
    except BaseException:
        sock.close()
        raise


def probe(
    master: tuple[str, int],
    end: int,
    *,
    broker_id: int,
    epoch: tuple[int, int],
    timeout_s: float = 5.0,
    config: HaConfig | None = None,
) -> dict[str, Any]:
    """Ask a master where its log ends and what its epochs are (one position frame):
    `{"max_offset", "min_offset", "epochs"}`. OSError/HaProtocolError when it cannot.
    `config`: the link's security (TLS, access key) and group, as the slave's."""
    import dataclasses

    cfg = dataclasses.replace(config or HaConfig(), broker_id=broker_id)
    sock = dial(cfg, master, end, epoch, kind=HELLO_PROBE, timeout_s=timeout_s)
    try:
        offset, data = recv_frame(sock, {POSITION_FRAME: MAX_POSITION}, 0)
    finally:
        sock.close()
    if offset != POSITION_FRAME:
        raise HaProtocolError(f"expected a position frame, got offset {offset}")
    answer = json.loads(data)
    if isinstance(answer, dict) and "refused" in answer and "max_offset" not in answer:
        raise MasterRefused(*_refusal_of(data))
    if not isinstance(answer, dict) or not isinstance(answer.get("max_offset"), int):
        raise HaProtocolError("a malformed position frame")
    answer["epochs"] = parse_epochs(answer.get("epochs"))
    return answer
