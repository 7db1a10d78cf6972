"""Automatic failover: etcd names each broker group's master (docs/ha.md, "Automatic
failover").

The decision who is master is etcd's, never this code's: a broker becomes master only by
a transaction that etcd applies once, and stays master only while its lease lives. What
runs here is each broker's side of it, one thread (`Failover`):

- every broker of the group holds a lease (`--failover-ttl-s`, renewed four times a TTL);
- a **follower** (a slave) reads who the master is every `poll_ms`, follows it (`HaSlave.
  follow`: its link goes to that master's HA port, and frames of a master of an older
  epoch are refused), and, when no master is named, **campaigns**: it publishes where its
  log ends (its candidacy, under its lease), waits `campaign_wait_ms` for the others to
  publish theirs, and goes on only if no live candidate is further along (last epoch,
  then log end, then the lower member id). Then one transaction: if the epoch key's
  mod_revision is the one it read and no leader key exists, put epoch N+1 and the leader
  key under its lease. Of two campaigns for the same epoch one succeeds; the other
  follows the winner at its next poll. The winner is promoted (`HaNode.promote`, epoch
  N+1 from its log end);
- a **master** renews its lease and checks the leader key still names it. It
  acknowledges a send only while `fence()` holds: until three quarters of a TTL after the
  start of its last successful renewal, which is before etcd can expire the lease (etcd
  counts the TTL from when it received that renewal). A master that cannot reach etcd
  therefore stops acknowledging before another broker can be named; one that finds
  itself no longer named (its lease expired) is **deposed**: it acknowledges nothing more
  and its process exits, to be restarted as a slave (it then rejoins, cutting only its
  unacknowledged tail, as `broker.ha.rejoin` does).

Key schema, under `/reliable/ha/<group>/`:

    epoch                "N"                 no lease. The group's epoch; every campaign
                                             compares its mod_revision
    leader               {"epoch", "member", under the master's lease: the master of
                          "ha", "endpoint",  `epoch`, its HA address (where slaves dial)
                          "lease"}           and gRPC endpoint (where producers send)
    candidates/<member>  {"epoch", "end",    under each follower's lease: its last epoch
                          "ha"}              and log end, published while no master is named
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from broker.errors import BrokerError
from broker.ha.config import parse_address
from broker.ha.errors import PromotionRefused
from broker.ha.etcd import Compare, CoordinatorUnavailable, KeyValue, Put
from broker.ha.master import HaMaster, fenced
from broker.ha.node import HaNode
from broker.ha.slave import HaSlave

log = logging.getLogger(__name__)

PREFIX = "/reliable/ha/"
FENCE_FRACTION = 0.75  # a master acknowledges for this part of a TTL after a renewal


class Coordinator(Protocol):
    """What failover uses of etcd (`broker.ha.etcd.EtcdClient`)."""

    host: str
    port: int

    def grant(self, ttl_s: int) -> tuple[int, int]: ...
    def keepalive(self, lease: int) -> int: ...
    def revoke(self, lease: int) -> None: ...
    def get(self, key: bytes) -> KeyValue | None: ...
    def get_prefix(self, prefix: bytes) -> list[KeyValue]: ...
    def put(self, key: bytes, value: bytes, *, lease: int = 0) -> None: ...
    def txn(self, compare: list[Compare], success: list[Put]) -> bool: ...


@dataclass(frozen=True)
class FailoverConfig:
    group: str  # the broker group (--broker-name)
    member: int  # this broker, among the group's (--broker-id, 1 or more)
    ha_address: str  # HOST:HAPORT where it listens once it is the master
    sync: bool  # it becomes a sync-master (else an async-master)
    ttl_s: int = 2  # its lease's TTL: a dead master is replaced after about this long
    poll_ms: int = 200  # how often a follower reads who the master is
    campaign_wait_ms: int = 500  # how long a candidate waits for better ones

    def validate(self) -> None:
        if self.member < 1:
            raise ValueError("with a coordinator, every broker's --broker-id is 1 or more")
        if self.ttl_s < 2:
            raise ValueError("the lease TTL is at least 2 s (etcd's own minimum)")
        if self.poll_ms < 10 or self.campaign_wait_ms < 2 * self.poll_ms:
            raise ValueError("poll at least every 10 ms; wait for candidates two polls or more")
        parse_address(self.ha_address)  # a fixed port: 0 is refused


@dataclass(frozen=True)
class Leader:
    """Who the leader key names."""

    epoch: int
    member: int
    ha: tuple[str, int]
    endpoint: str
    lease: int
    mod_revision: int


def parse_leader(kv: KeyValue) -> Leader:
    body = json.loads(kv.value)
    return Leader(
        epoch=int(body["epoch"]),
        member=int(body["member"]),
        ha=parse_address(str(body["ha"])),
        endpoint=str(body.get("endpoint", "")),
        lease=int(body.get("lease", 0)),
        mod_revision=kv.mod_revision,
    )


class Failover:
    """One broker's part in its group's automatic failover (see the module docstring)."""

    def __init__(
        self,
        client: Coordinator,
        config: FailoverConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        config.validate()
        self._node: HaNode | None = None
        self.client = client
        self.config = config
        self.endpoint = ""  # this broker's gRPC endpoint, set once its server listens
        self._clock = clock
        root = f"{PREFIX}{config.group}/"
        self._epoch_key = (root + "epoch").encode()
        self._leader_key = (root + "leader").encode()
        self._candidates = (root + "candidates/").encode()
        self._lease = 0
        self._ttl = config.ttl_s
        self._renewed_at = float("-inf")  # when the last successful renewal was asked
        self._valid_until = float("-inf")  # a master acknowledges until then
        self.epoch = 0  # the group's epoch, as last read
        self.leader: Leader | None = None
        self.deposed = threading.Event()  # this master is no longer named: exit
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ha-failover", daemon=True)
        self._quiet_until = 0.0  # the next "etcd unavailable" line

    def bind(self, node: HaNode) -> None:
        """The broker's replication, once its store is ready (after `find_master`)."""
        self._node = node
        node.fence = self.fence
        node.coordinator_status = self.status

    @property
    def node(self) -> HaNode:
        if self._node is None:
            raise RuntimeError("Failover.bind was not called")
        return self._node

    # --- what the rest of the broker asks
    def fence(self) -> bool:
        """True while this broker's lease is sure to hold (see the module docstring)."""
        return not self.deposed.is_set() and self._clock() < self._valid_until

    def status(self) -> dict[str, object]:
        """The coordinator's part of `HaStatus`."""
        leader = self.leader
        left = self._valid_until - self._clock()
        return {
            "coordinator": f"etcd://{self.client.host}:{self.client.port}",
            "member": self.config.member,
            "epoch": self.epoch,
            "lease": self._lease or None,
            "lease_ttl_s": self._ttl,
            "leader": None
            if leader is None
            else {
                "epoch": leader.epoch,
                "member": leader.member,
                "ha": f"{leader.ha[0]}:{leader.ha[1]}",
                "endpoint": leader.endpoint,
            },
            "acknowledging_ms": max(int(left * 1000), 0) if self._is_master() else None,
            "deposed": self.deposed.is_set(),
        }

    # --- start and stop
    def find_master(self, timeout_s: float = 60.0) -> tuple[str, int] | None:
        """Before the broker replicates: the HA address of the group's master when
        another broker is it (the store then rejoins it), None when none is named (the
        broker campaigns once started). A group that has had a master before prefers a
        broker that kept running: when no leader key is found, or one naming this member
        (from before its restart: its lease expires), the broker waits a TTL and two
        campaign waits for another member to be named before it campaigns itself; so a
        restarted master rejoins as a slave of its successor, and one alone takes its
        group back. CoordinatorUnavailable when etcd does not answer within `timeout_s`."""
        deadline = self._clock() + timeout_s
        while True:
            try:
                self._renew()
                kv = self.client.get(self._leader_key)
                known = kv is not None or self.client.get(self._epoch_key) is not None
                break
            except CoordinatorUnavailable:
                if self._clock() > deadline:
                    raise
                time.sleep(self.config.poll_ms / 1000)
        if not known:
            return None  # a new group: every member campaigns
        patience = self._clock() + self._ttl + 2 * self.config.campaign_wait_ms / 1000 + 1
        while True:
            if kv is not None:
                leader = parse_leader(kv)
                self.leader = leader
                self.epoch = max(self.epoch, leader.epoch)
                if leader.member != self.config.member:
                    return leader.ha
            if self._clock() > patience:
                return None
            time.sleep(self.config.poll_ms / 1000)
            with contextlib.suppress(CoordinatorUnavailable):
                kv = self.client.get(self._leader_key)

    def start(self) -> None:
        slave = self.node.replication
        leader = self.leader
        if (
            isinstance(slave, HaSlave)
            and leader is not None
            and leader.member != self.config.member
        ):
            slave.follow(leader.ha, leader.epoch)
        self._thread.start()

    def stop(self) -> None:
        """Stop; a clean stop ends the lease, so another broker takes over at once."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self._lease:
            with contextlib.suppress(CoordinatorUnavailable):
                self.client.revoke(self._lease)
            self._lease = 0

    # --- the loop
    def _is_master(self) -> bool:
        return self._node is not None and isinstance(self._node.replication, HaMaster)

    def _run(self) -> None:
        poll_s = self.config.poll_ms / 1000
        while not self._stopped.is_set() and not self.deposed.is_set():
            try:
                self.poll()
            except CoordinatorUnavailable as exc:
                self._unavailable(exc)
            except (BrokerError, ValueError, KeyError, TypeError) as exc:
                log.warning("coordinator: %s", exc)
            self._stopped.wait(poll_s)

    def poll(self) -> None:
        """One turn of the loop: renew the lease when due (four times a TTL); a master
        checks it is still named, a follower follows the named master or campaigns.
        CoordinatorUnavailable when etcd does not answer."""
        if not self._lease or self._clock() - self._renewed_at >= self._ttl / 4:
            self._renew()
        if self.deposed.is_set():
            return
        if self._is_master():
            self._check_leadership()
        else:
            self._follow_or_campaign()

    def _unavailable(self, exc: CoordinatorUnavailable) -> None:
        now = self._clock()
        if now < self._quiet_until:
            return
        self._quiet_until = now + 5.0
        if self._is_master():
            left = max(self._valid_until - now, 0.0)
            log.warning(
                "coordinator: %s; acknowledging %.1f s more unless the lease is renewed", exc, left
            )
        else:
            log.warning("coordinator: %s; no failover while it is down", exc)

    def _renew(self) -> None:
        asked = self._clock()
        if not self._lease:
            self._lease, self._ttl = self.client.grant(self.config.ttl_s)
            self._renewed_at = asked
            return
        ttl = self.client.keepalive(self._lease)
        if ttl <= 0:
            if self._is_master():
                self._depose(f"its lease {self._lease} expired")
            self._lease = 0
            return
        self._ttl = ttl
        self._renewed_at = asked
        if self._is_master():
            self._valid_until = asked + ttl * FENCE_FRACTION

    def _depose(self, why: str) -> None:
        self._valid_until = float("-inf")
        self.deposed.set()
        log.error(
            "coordinator: no longer the master of %s (%s): this broker acknowledges nothing "
            "more; restart it to rejoin its group as a slave",
            self.config.group,
            why,
        )

    def _check_leadership(self) -> None:
        kv = self.client.get(self._leader_key)
        leader = parse_leader(kv) if kv is not None else None
        if (
            leader is None
            or leader.member != self.config.member
            or leader.epoch != self.epoch
            or leader.lease != self._lease
        ):
            self._depose("the leader key no longer names it")
            return
        self.leader = leader

    def _follow_or_campaign(self) -> None:
        kv = self.client.get(self._leader_key)
        if kv is not None:
            leader = parse_leader(kv)
            self.leader = leader
            self.epoch = max(self.epoch, leader.epoch)
            if leader.member != self.config.member:
                slave = self.node.replication
                if isinstance(slave, HaSlave):
                    slave.follow(leader.ha, leader.epoch)
            elif self._lease and leader.lease == self._lease:
                # a campaign won whose answer was lost: take the epoch it won
                self._promote(leader.epoch, self._renewed_at)
            # else naming this member from before its restart: it expires with its lease
            return
        self.leader = None
        self._campaign()

    def _candidates_now(self) -> dict[int, tuple[int, int]]:
        out: dict[int, tuple[int, int]] = {}
        for kv in self.client.get_prefix(self._candidates):
            try:
                member = int(kv.key.rsplit(b"/", 1)[1])
                body = json.loads(kv.value)
                out[member] = (int(body["epoch"]), int(body["end"]))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def _campaign(self) -> None:
        me = self.config.member
        end = self.node.broker.store.get_commitlog_max_offset()
        last = self.node.epochs.last[0]
        mine = {"epoch": last, "end": end, "ha": self.config.ha_address}
        self.client.put(
            self._candidates + str(me).encode(), json.dumps(mine).encode(), lease=self._lease
        )
        if self._stopped.wait(self.config.campaign_wait_ms / 1000):
            return
        if self.client.get(self._leader_key) is not None:
            return
        candidates = self._candidates_now()
        candidates[me] = (last, end)
        best = max(candidates, key=lambda m: (*candidates[m], -m))
        if best != me:
            log.info(
                "coordinator: member %d is further along (%s; this one %s): not campaigning",
                best,
                candidates[best],
                (last, end),
            )
            return
        epoch_kv = self.client.get(self._epoch_key)
        current = int(epoch_kv.value) if epoch_kv is not None else 0
        new = max(current, last, self.epoch) + 1
        value = {
            "epoch": new,
            "member": me,
            "ha": self.config.ha_address,
            "endpoint": self.endpoint,
            "lease": self._lease,
        }
        renewed = self._renewed_at
        won = self.client.txn(
            [
                Compare(self._epoch_key, epoch_kv.mod_revision if epoch_kv else 0),
                Compare(self._leader_key, 0),
            ],
            [
                Put(self._epoch_key, str(new).encode()),
                Put(self._leader_key, json.dumps(value).encode(), self._lease),
            ],
        )
        if not won:
            log.info("coordinator: another broker took epoch %d first; following it", new)
            return
        self._promote(new, renewed)

    def _promote(self, new: int, renewed: float) -> None:
        """This broker won epoch `new` (its lease last renewed as asked at `renewed`)."""
        me = self.config.member
        end = self.node.broker.store.get_commitlog_max_offset()
        self.epoch = new
        # the leader key lives as long as the lease: at least a TTL from its last renewal
        self._valid_until = renewed + self._ttl * FENCE_FRACTION
        try:
            self.node.promote(sync=self.config.sync, force=True, epoch=new)
        except PromotionRefused as exc:
            log.error("coordinator: won epoch %d but cannot be promoted: %s", new, exc)
            self._valid_until = float("-inf")
            lease, self._lease = self._lease, 0
            self.client.revoke(lease)  # another broker takes the epoch
            return
        log.warning(
            "coordinator: the master of %s in epoch %d, from offset %d (member %d)",
            self.config.group,
            new,
            end,
            me,
        )


class LeaseGate:
    """An async-master's acknowledgement gate with a coordinator: a send is answered
    stored only while the lease holds (`broker.server.context.SyncReplication`)."""

    def __init__(self, fence: Callable[[], bool]) -> None:
        self.fence = fence

    def when_replicated(self, end: int, callback: Callable[[BrokerError | None], None]) -> None:
        callback(None if self.fence() else fenced())
