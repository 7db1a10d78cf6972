"""A SYNC_MASTER's machine lost while official-client producers send (docs/ha.md, "What
each role and mode guarantees"): the master SIGKILLed and its store directory deleted.
Every acknowledged message is on the slave (read there with the admin service's query,
not a consumer), and after the operator promotes it, the official client consumes every
one from it; the old master, started on its now empty store directory as a slave of the
promoted one, copies the whole log and ends byte for byte the same.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from protocol.ports import free_port
from tests.e2e.grpc import official
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.server_process import ServerProcess, admin_cli

TOPIC = "t-ha-lost-disk"
GROUP = "g-ha-lost-disk"
PRODUCERS = 2
BEFORE_KILL = 200  # acknowledgements before the master is killed


def _digest(store: Path) -> list[tuple[str, str]]:
    """Every commitlog file that holds a record, by name and SHA-256. The files are
    preallocated with zeros, so equal digests mean the same records at the same offsets
    and nothing beyond. A file of zeros only is left out: the master's next file,
    allocated ahead once the one being written is half full; a slave creates each file
    as its first record arrives (docs/ha.md)."""
    out = []
    for p in sorted((store / "commitlog").iterdir()):
        if p.name.isdigit():
            data = p.read_bytes()
            if data.count(0) != len(data):
                out.append((p.name, hashlib.sha256(data).hexdigest()))
    return out


def _promote(endpoint: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return admin_cli("broker", "promote", "--endpoint", endpoint, "--json", *flags)


class Sends:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: list[str] = []
        self.failed = 0
        self.stop = threading.Event()

    def produce(self, endpoint: str, who: int) -> None:
        producer = official.producer(endpoint, [TOPIC])
        try:
            i = 0
            while not self.stop.is_set():
                try:
                    receipt = producer.send(
                        official.message(TOPIC, f"p{who}-{i}".encode() * 20, keys=[f"p{who}-{i}"])
                    )
                except Exception:
                    with self.lock:
                        self.failed += 1
                    if self.stop.wait(0.05):
                        return
                    continue
                with self.lock:
                    self.acked.append(receipt.message_id)
                i += 1
        finally:
            producer.shutdown()

    def count(self) -> int:
        with self.lock:
            return len(self.acked)


@pytest.mark.chaos
@pytest.mark.slow
def test_sync_master_disk_lost_mid_send_loses_no_acknowledged_message(
    tmp_path: Path, client_home: Path
) -> None:
    from reliable.admin import AdminClient

    home = client_home  # the official client's log directory (tests/chaos/conftest.py)
    m_store, s_store = tmp_path / "m", tmp_path / "s"
    m_ha, s_ha = free_port(), free_port()
    servers: list[ServerProcess] = []

    def start(store: Path, *extra: str) -> ServerProcess:
        proc = ServerProcess(store, home, *FAST, "--flush", "sync", *extra).start()
        servers.append(proc)
        return proc

    sends = Sends()
    threads: list[threading.Thread] = []
    try:
        master = start(
            m_store,
            *("--role", "sync-master", "--ha-port", str(m_ha)),
            *("--ha-sync-timeout-ms", "2000"),
        )
        slave = start(
            s_store,
            *("--role", "slave", "--broker-id", "1", "--ha-port", str(s_ha)),
            *("--master", f"127.0.0.1:{m_ha}"),
        )
        threads = [
            threading.Thread(target=sends.produce, args=(master.endpoint, n), daemon=True)
            for n in range(PRODUCERS)
        ]
        for th in threads:
            th.start()
        assert official.wait_for(lambda: sends.count() >= BEFORE_KILL, timeout_s=60)
        # the machine is lost: the process killed while the producers send, its disk gone
        master.kill()
        shutil.rmtree(m_store)
        sends.stop.set()
        for th in threads:
            th.join(60)
        acked = set(sends.acked)
        assert len(acked) >= BEFORE_KILL

        # 1. every acknowledged message is on the slave (its admin service reads its
        # store; the slave stays a slave, read-only)
        admin = AdminClient(slave.endpoint)
        try:
            missing = set(acked)

            def found() -> bool:  # the index is built a moment after the write
                missing.difference_update(
                    [
                        mid
                        for mid in missing
                        if admin.call("QueryMessage", unique_key=mid, topic=TOPIC)["messages"]
                    ]
                )
                return not missing

            assert official.wait_for(found, timeout_s=30, interval_s=0.5), (
                f"{len(missing)} acknowledged messages not on the slave"
            )
            assert admin.ha_status()["role"] == "slave"
        finally:
            admin.close()

        # 2. the operator promotes it. The dead master may have stored records the
        # slave never got (never acknowledged: a SYNC_MASTER answers only after the
        # slave has the record), which the slave's last frame may have announced: then
        # promotion asks for --force.
        done = _promote(slave.endpoint)
        if done.returncode != 0:
            assert "not-caught-up" in done.stderr, done.stderr
            done = _promote(slave.endpoint, "--force")
        assert done.returncode == 0, done.stderr
        promoted = json.loads(done.stdout)
        assert promoted["after"]["role"] == "async-master"
        consumer = official.simple_consumer(slave.endpoint, GROUP, TOPIC)
        try:
            got = official.receive_until(
                consumer, lambda g: acked <= {m.message_id for m in g}, timeout_s=90
            )
        finally:
            consumer.shutdown()
        lost = acked - {m.message_id for m in got}
        assert lost == set(), f"{len(lost)} of {len(acked)} acknowledged messages lost"

        # 3. the old master's machine comes back with an empty disk: it rejoins as a
        # slave of the promoted one and copies everything, byte for byte
        assert not m_store.exists()
        old = start(
            m_store,
            *("--role", "slave", "--broker-id", "1", "--ha-port", str(m_ha)),
            *("--master", f"127.0.0.1:{s_ha}"),
        )
        assert official.wait_for(lambda: _digest(m_store) == _digest(s_store), timeout_s=90)
        admin = AdminClient(slave.endpoint)
        try:
            status: dict[str, Any] = admin.ha_status()
        finally:
            admin.close()
        assert status["slaves"] and status["lag_bytes"] == 0, status
        assert old.terminate() == 0, "".join(old.output)
        assert slave.terminate() == 0, "".join(slave.output)
        assert _digest(m_store) == _digest(s_store)
        print(
            f"observed: acknowledged {len(acked)}, failed sends {sends.failed}, "
            f"promotion {'forced' if '--force' in done.args else 'plain'}, "
            f"log {promoted['after']['max_offset']} bytes copied to the old master"
        )
    finally:
        sends.stop.set()
        for proc in servers:
            proc.kill()
