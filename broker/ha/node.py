"""A broker's replication role, and the operator's change of it: promotion.

`HaNode` runs the master side (`HaMaster`) or the slave side (`HaSlave`) of one broker,
keeps the epoch history and the acknowledged offset in `<store>/ha/` (`state.py`), and
answers the admin service's `HaStatus` and `PromoteBroker`.

Promotion (RocketMQ has no automatic one; an operator decides): a running slave becomes
the master of its group without a restart. It is refused (`PromotionRefused`) when the
broker is not a slave, when the slave lacks bytes its master had (as of the master's last
frame) or never heard from it, or when its master is still connected and alive; `force`
skips the last two. Then, in this order: the HA listener opens on the slave's HA port
(refused if it cannot, nothing changed), the slave stops copying, a new epoch begins at
its log end (durable), the broker turns writable and starts the services a slave does
not run, and the server's hooks (`on_promoted`) let sends in.

Rejoin: a running slave whose master refuses its log's history cuts its store back to
where the master's copy ends, in-process (`rejoin`, broker/ha/rejoin.py), and the
server's hooks (`on_rejoined`) hear of it. The broker object, its store and every
reference to them stay the same: the store is cut back while it runs
(`MessageStore.cut_back`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from broker.broker import Broker
from broker.ha.config import HaConfig, HaRole
from broker.ha.errors import PromotionRefused
from broker.ha.master import HaMaster
from broker.ha.rejoin import Rejoin, rejoin_running
from broker.ha.slave import HaSlave
from broker.ha.state import AckedCheckpoint, EpochHistory, save_role

log = logging.getLogger(__name__)


class HaNode:
    """One broker's replication: a master's or a slave's side, and promotion."""

    def __init__(self, broker: Broker, config: HaConfig) -> None:
        config.validate()
        if config.role is HaRole.NONE:
            raise ValueError("no replication role")
        self.broker = broker
        self.config = config
        store_dir = broker.store.config.store_dir
        self.epochs = EpochHistory(store_dir)
        self._store_dir = store_dir
        # with a coordinator: True while this broker's lease is sure to hold; a master it
        # makes acknowledges sends only then (`HaMaster.fence`). None: no coordinator
        self.fence: Callable[[], bool] | None = None
        self.replication: HaMaster | HaSlave = self._make(config)
        self._lock = threading.Lock()
        # called with the new master once a promotion is done (the server lets writes in)
        self.on_promoted: list[Callable[[HaMaster], None]] = []
        self.promoted_ms = 0
        # with a coordinator: its part of `HaStatus` (`broker.ha.failover`); None: none
        self.coordinator_status: Callable[[], dict[str, Any]] | None = None
        # called with each cut a running rejoin made (the server says so)
        self.on_rejoined: list[Callable[[Rejoin], None]] = []
        self.rejoined: dict[str, Any] | None = None  # the last one, for `HaStatus`

    @property
    def role(self) -> HaRole:
        return self.config.role

    def _make(self, config: HaConfig) -> HaMaster | HaSlave:
        if config.role.is_master:
            master = HaMaster(
                self.broker.store,
                config,
                epochs=self.epochs,
                acked=AckedCheckpoint(self._store_dir),
            )
            master.fence = self.fence
            master.config_source = self.broker.config_snapshot
            master.acting_sink = self.broker.merge_acting_offsets
            return master
        slave = HaSlave(self.broker.store, config, epochs=self.epochs)
        slave.config_sink = self.broker.apply_config_snapshot
        slave.acting_source = self.broker.acting_report
        slave.rejoin = self.rejoin
        return slave

    def rejoin(self, master: tuple[str, int]) -> bool:
        """The slave's master refused its log's history: cut the running store back to
        where the master's copy ends (broker/ha/rejoin.py); called on the slave's thread,
        its link down. True when something changed (the log, or the epochs it keeps).
        RejoinRefused when acknowledged bytes would be cut; OSError, HaProtocolError,
        ssl.SSLError when the master cannot be asked now."""
        before = self.epochs.entries
        plan = rejoin_running(self.broker.store, self.config, master, self.epochs)
        if plan is None:
            return self.epochs.entries != before
        self.rejoined = {
            "offset": plan.offset,
            "end": plan.end,
            "messages": plan.messages,
            "saved": str(plan.saved),
            "master": f"{master[0]}:{master[1]}",
            "at_ms": int(time.time() * 1000),
        }
        log.warning(
            "rejoined as a slave of %s:%d, running: cut %d bytes (%d messages) beyond offset "
            "%d, the master's copy of this log (acknowledged by a slave: up to %d); they are "
            "kept in %s",
            *master,
            plan.bytes,
            plan.messages,
            plan.offset,
            plan.acked,
            plan.saved,
        )
        for hook in self.on_rejoined:
            hook(plan)
        return True

    def start(self) -> None:
        self._save_role()
        self.replication.start()

    def _save_role(self) -> None:
        """What a stopped store says it is (`reliable admin broker status --store`)."""
        cfg = self.config
        master = f"{cfg.master[0]}:{cfg.master[1]}" if cfg.master else None
        save_role(self._store_dir, cfg.role.value, cfg.broker_name, cfg.broker_id, master)

    def reads_ready(self) -> bool:
        """A master serves receives once a slave has been heard from since it started, or
        after a grace of three redial intervals (at least 3 s): a slave that served its
        receives while it was down reports first what it acknowledged (docs/ha.md
        "Reading from a slave"), so none of that is handed out again. A slave: always."""
        master = self.replication
        if not isinstance(master, HaMaster) or master.heard_from_slave.is_set():
            return True
        grace_s = max(3.0, 3 * self.config.reconnect_ms / 1000)
        return time.monotonic() - master.started >= grace_s

    def stop(self) -> None:
        with self._lock:
            self.replication.stop()

    def status(self) -> dict[str, Any]:
        out = self.replication.status()
        if isinstance(self.replication, HaSlave):
            out["acting"] = self.broker.acting  # serving receives for its dead master
        if self.promoted_ms:
            out["promoted_ms"] = self.promoted_ms
        if self.rejoined is not None:
            out["rejoined"] = self.rejoined
        if self.coordinator_status is not None:
            out["coordinator"] = self.coordinator_status()
        return out

    def promote(
        self, *, sync: bool = False, force: bool = False, epoch: int | None = None
    ) -> dict[str, Any]:
        """Make this slave the master of its group (see the module docstring); returns
        the status before and after. `epoch`: the new epoch's number, when a coordinator
        decided it (`broker.ha.failover`); None: the next."""
        with self._lock:
            slave = self.replication
            if not isinstance(slave, HaSlave):
                raise PromotionRefused(
                    "not-a-slave", f"this broker is a {self.config.role.value} already"
                )
            before = slave.status()
            end = self.broker.store.get_commitlog_max_offset()
            known = slave.master_max_offset
            if not force:
                if slave.master_alive():
                    raise PromotionRefused(
                        "master-alive",
                        f"its master {before['master']} is connected and alive; stop it "
                        "first, or promote with --force (two masters then take writes)",
                    )
                if known < 0:
                    raise PromotionRefused(
                        "not-caught-up",
                        "it has not heard from its master since it started, so how far "
                        "behind it is is unknown; --force promotes it anyway",
                    )
                if end < known:
                    raise PromotionRefused(
                        "not-caught-up",
                        f"its log ends at {end}, its master's at {known} (as of its last "
                        f"frame): {known - end} bytes short; --force promotes it anyway "
                        "and those bytes are lost",
                    )
            role = HaRole.SYNC_MASTER if sync else HaRole.ASYNC_MASTER
            config = dataclasses.replace(self.config, role=role, broker_id=0, master=None)
            master = self._make(config)
            assert isinstance(master, HaMaster)
            try:
                master.start()  # bind first: a port in use changes nothing
            except OSError as exc:
                raise PromotionRefused(
                    "ha-port", f"cannot listen on {config.host}:{config.port}: {exc}"
                ) from None
            slave.stop()
            end = self.broker.store.get_commitlog_max_offset()
            new_epoch = self.epochs.begin(end, epoch)
            self.broker.promote()
            self.config = config
            self.replication = master
            self._save_role()
            self.promoted_ms = int(time.time() * 1000)
            for hook in self.on_promoted:
                hook(master)
            log.warning(
                "promoted: %s %s, epoch %d from offset %d (was the slave of %s)",
                role.value,
                config.broker_name,
                new_epoch[0],
                end,
                before["master"],
            )
            return {
                "before": before,
                "after": master.status(),
                "forced": force,
                "epoch": list(new_epoch),
            }
