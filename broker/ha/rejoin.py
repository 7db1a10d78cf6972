"""A store rejoining its group as a slave: find where its log parts from the master's,
and cut it back there when nothing beyond was acknowledged as replicated.

An old master restarted as a slave of the slave that replaced it may hold a tail the new
master never had: records it stored after the last one its slave acknowledged (under
SYNC_MASTER they were never acknowledged to a producer as stored; under ASYNC_MASTER they
were). Before it replicates, `plan_rejoin` asks the master for its log end and epoch
history (a probe) and finds the branch point (`state.branch_point`). When the log goes
beyond it:

- if a slave acknowledged bytes beyond the branch point to this broker while it was a
  master (`state.read_acked`), cutting would lose what a producer was told is
  replicated: `RejoinRefused`, naming both offsets;
- else the tail is copied to `<store>/ha/truncated-<offset>.bin` (the records as they
  were, commitlog format), and the store is started again with `truncate_to` set: its
  recovery cuts the commitlog there and the consume queues and index with it
  (`MessageStore.start`).

A running slave that its master refuses for its history (`MasterRefused`, reason
`history`: its master was replaced by one with a shorter log, say) does the same without
a restart: `rejoin_running` asks the master, saves the tail, and cuts the running store
back (`MessageStore.cut_back`), then keeps only the epochs both histories share.
"""

from __future__ import annotations

import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.ha.config import HaConfig
from broker.ha.errors import RejoinRefused
from broker.ha.protocol import HaProtocolError
from broker.ha.slave import probe
from broker.ha.state import EpochHistory, branch_point, ha_dir, read_acked, shared_epochs
from broker.store.store import MessageStore

log = logging.getLogger(__name__)

CHUNK = 1 << 20


@dataclass(frozen=True)
class Rejoin:
    """A cut to make: the log goes from `offset` to `end` beyond the master's copy."""

    offset: int
    end: int
    messages: int
    saved: Path
    master_end: int
    acked: int  # what a slave acknowledged to this store as a master (-1: nothing)

    @property
    def bytes(self) -> int:
        return self.end - self.offset


def plan_rejoin(
    store: MessageStore, config: HaConfig, epochs: EpochHistory, *, timeout_s: float = 5.0
) -> Rejoin | None:
    """The cut this running store needs before it replicates from `config.master`: None
    when its log continues the master's, or when the master cannot be asked now (logged;
    if the master then refuses the slave, it rejoins running: `rejoin_running`).
    RejoinRefused when the cut
    would lose acknowledged bytes. The tail is saved before this returns."""
    assert config.master is not None
    if store.get_commitlog_max_offset() <= 0:
        return None
    try:
        answer = _ask(store, config, config.master, epochs, timeout_s)
    except (OSError, HaProtocolError, ValueError, ssl.SSLError) as exc:
        log.warning(
            "replication: cannot ask the master %s:%d where its log ends (%s); "
            "replicating without a rejoin check",
            *config.master,
            exc,
        )
        return None
    return _plan(store, epochs, answer)


def rejoin_running(
    store: MessageStore,
    config: HaConfig,
    master: tuple[str, int],
    epochs: EpochHistory,
    *,
    timeout_s: float = 5.0,
) -> Rejoin | None:
    """A running slave refused by `master` for its history: plan the cut as at a start,
    then cut the running store back (`MessageStore.cut_back`) and keep only the epochs
    both histories share. The cut made, or None when none was needed (the epochs may
    still have been trimmed). RejoinRefused when the cut would lose acknowledged bytes;
    OSError, HaProtocolError, ssl.SSLError when the master cannot be asked now; StoreError
    when the store is not running. Nobody may append meanwhile (the caller's replication
    is stopped)."""
    answer = _ask(store, config, master, epochs, timeout_s)
    plan = _plan(store, epochs, answer) if store.get_commitlog_max_offset() > 0 else None
    if plan is not None:
        store.cut_back(plan.offset)
    shared = shared_epochs(epochs.entries, answer["epochs"])
    if shared and shared != epochs.entries:
        epochs.replace(shared)
    return plan


def _ask(
    store: MessageStore,
    config: HaConfig,
    master: tuple[str, int],
    epochs: EpochHistory,
    timeout_s: float,
) -> dict[str, Any]:
    return probe(
        master,
        store.get_commitlog_max_offset(),
        broker_id=config.broker_id,
        epoch=epochs.last,
        timeout_s=timeout_s,
        config=config,
    )


def _plan(store: MessageStore, epochs: EpochHistory, answer: dict[str, Any]) -> Rejoin | None:
    """The cut this store's log needs to continue the log `answer` (a probe) describes;
    the tail saved before it returns. RejoinRefused when acknowledged bytes would go."""
    end = store.get_commitlog_max_offset()
    master_end = int(answer["max_offset"])
    branch = branch_point(epochs.entries, end, answer["epochs"], master_end)
    if branch >= end:
        return None
    acked = read_acked(store.config.store_dir)
    if acked > branch:
        raise RejoinRefused(
            f"this store's log holds {end - branch} bytes beyond offset {branch}, where the "
            f"master's copy ends, but a slave acknowledged this log up to offset {acked}: "
            "cutting it would lose acknowledged messages. Promote the slave that has them, "
            "or start this broker from an empty store"
        )
    saved = ha_dir(store.config.store_dir) / f"truncated-{branch}.bin"
    messages = save_tail(store, branch, end, saved)
    return Rejoin(branch, end, messages, saved, master_end, acked)


def save_tail(store: MessageStore, offset: int, end: int, path: Path) -> int:
    """Copy the log's records from `offset` to `end` into `path` (fsynced); how many
    messages they are."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        at = offset
        while at < end:
            data = store.read_replica(at, CHUNK)
            if not data:
                break
            data = data[: end - at]
            out.write(data)
            at += len(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    count, _ = store.commitlog.count_records(offset, end, 1 << 62)
    return count
