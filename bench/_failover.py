"""Automatic failover with real processes: etcd, a broker group, a producer, kills.

Used by `python -m bench ha` (its `failover` case) and by the chaos test
(`tests/chaos/test_ha_auto_failover.py`). Everything is a real process on loopback:

- etcd (Debian's `etcd` binary; `scripts/ensure-system.sh` installs `etcd-server`), its
  data directory in the work directory, on free ports;
- a group of brokers, `reliable broker start --failover auto --coordinator etcd://...
  --role sync-master --flush sync`, members 1 and 2, each on its own store and ports;
- a producer thread sending raw gRPC `SendMessage` calls, one message per call, to the
  endpoint the leader key names, each attempt of a message under its own id and body
  (`m<seq>-a<attempt>`), so an acknowledged attempt can be found exactly once in a store
  whatever the attempts before it left behind. A failed attempt re-reads the leader and
  tries again 50 ms later; the framework's own retry policy is not used.

`run` SIGKILLs the master `kills` times at seeded random moments, restarting each killed
broker at once (as a supervisor would; it rejoins as a slave), and reports for each kill
the time from the SIGKILL to the first send acknowledged by the new master.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._tls import MutualTls
from broker.ha.etcd import CoordinatorUnavailable, EtcdClient

REPO = Path(__file__).resolve().parents[1]
GROUP = "broker-a"
TOPIC = "t-failover"
TTL_S = 2
STORE = (
    *("--commitlog-file-size", str(8 << 20)),
    *("--disk-clean-ratio", "1.0", "--disk-full-ratio", "1.0"),
)
_PROMOTED = re.compile(r"promoted to \S+ \S+, replication on \S+, epoch (\d+)")


class FailoverFailed(Exception):
    """A failover run went wrong (what, and the processes' last lines)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def etcd_binary() -> str | None:
    return shutil.which("etcd")


class Etcd:
    """One etcd member on free loopback ports, its data in `data_dir`; with `tls`, its
    client port speaks TLS only and wants a client certificate signed by `tls.ca`
    (`--client-cert-auth`)."""

    def __init__(self, data_dir: Path, tls: MutualTls | None = None) -> None:
        self.data_dir = data_dir
        self.tls = tls
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir.with_suffix(".log")

    @property
    def url(self) -> str:
        scheme = "etcds" if self.tls else "etcd"
        return f"{scheme}://127.0.0.1:{self.client_port}"

    def client_options(self) -> list[str]:
        """The `reliable broker start` options that reach this etcd."""
        options = ["--coordinator", self.url]
        if self.tls is not None:
            options += ["--coordinator-ca", str(self.tls.ca)]
            options += ["--coordinator-cert", str(self.tls.client_cert)]
            options += ["--coordinator-key", str(self.tls.client_key)]
        return options

    def client(self, timeout_s: float = 0.5) -> EtcdClient:
        tls = self.tls
        if tls is None:
            return EtcdClient.from_url(self.url, timeout_s=timeout_s)
        return EtcdClient.from_url(
            self.url,
            timeout_s=timeout_s,
            ca_file=str(tls.ca),
            cert_file=str(tls.client_cert),
            key_file=str(tls.client_key),
        )

    def start(self) -> None:
        binary = etcd_binary()
        if binary is None:
            raise FailoverFailed("no etcd binary (Debian: apt-get install etcd-server)")
        scheme = "https" if self.tls else "http"
        client = f"{scheme}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [binary, "--name", "default", "--data-dir", str(self.data_dir)]
        argv += ["--listen-client-urls", client, "--advertise-client-urls", client]
        argv += ["--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer]
        argv += ["--initial-cluster", f"default={peer}"]
        if self.tls is not None:
            argv += ["--cert-file", str(self.tls.server_cert)]
            argv += ["--key-file", str(self.tls.server_key)]
            argv += ["--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        client_ = self.client()
        deadline = time.monotonic() + 20
        while True:
            try:
                client_.get(b"/probe")
                return
            except CoordinatorUnavailable:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    why = self.log.read_text()[-800:]
                    raise FailoverFailed(f"etcd did not start: {why}") from None
                time.sleep(0.1)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


class Member:
    """One broker of the group: `reliable broker start --failover auto ...`."""

    def __init__(self, member: int, workdir: Path, etcd: Etcd, *extra: str) -> None:
        self.member = member
        self.store = workdir / f"b{member}"
        self.home = workdir / "home"
        self.port = free_port()
        self.ha_port = free_port()
        self.etcd = etcd
        self.extra = extra
        self.proc: subprocess.Popen[str] | None = None
        self.output: list[str] = []
        self.lives = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HOME=str(self.home), PYTHONUNBUFFERED="1")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        argv = [sys.executable, "-m", "reliable_cli", "broker", "start"]
        argv += ["--store", str(self.store), "--port", str(self.port), *STORE]
        argv += ["--flush", "sync", "--role", "sync-master", "--broker-name", GROUP]
        argv += ["--broker-id", str(self.member), "--ha-port", str(self.ha_port)]
        argv += [*self.etcd.client_options(), "--failover", "auto"]
        argv += ["--failover-ttl-s", str(TTL_S), "--ha-sync-timeout-ms", "2000", *self.extra]
        self.lives += 1
        self.output.append(f"--- start {self.lives}\n")
        self.proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO
        )
        proc = self.proc

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.output.append(line)

        threading.Thread(target=pump, name=f"member-{self.member}", daemon=True).start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def epochs_won(self) -> list[int]:
        """The epochs this broker was promoted in, from its output (every life)."""
        return [int(m.group(1)) for line in self.output if (m := _PROMOTED.search(line))]


def leader(client: Any) -> dict[str, Any] | None:
    """The leader key of the group, as JSON (None: no master named)."""
    import json

    kv = client.get(f"/reliable/ha/{GROUP}/leader".encode())
    if kv is None:
        return None
    value: dict[str, Any] = json.loads(kv.value)
    return value


@dataclass
class Ack:
    body: str
    endpoint: str
    at: float  # time.monotonic()


@dataclass
class Sender:
    """The producer thread (see the module docstring)."""

    etcd: Etcd
    acks: list[Ack] = field(default_factory=list)
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def run(self) -> None:
        import grpc

        from protocol.pb import service_pb2, service_pb2_grpc

        client = self.etcd.client()
        md = [("x-mq-client-id", "failover-bench"), ("x-mq-namespace", "")]
        channels: dict[str, Any] = {}
        seq = attempt = 0
        endpoint = ""
        while not self.stop.is_set():
            if not endpoint:
                try:
                    named = leader(client)
                except CoordinatorUnavailable:
                    named = None
                endpoint = str(named["endpoint"]) if named else ""
                if not endpoint:
                    self.stop.wait(0.05)
                    continue
            if endpoint not in channels:
                channels[endpoint] = service_pb2_grpc.MessagingServiceStub(
                    grpc.insecure_channel(endpoint)
                )
            body = f"m{seq}-a{attempt}"
            request = service_pb2.SendMessageRequest()
            msg = request.messages.add()
            msg.topic.name = TOPIC
            msg.body = body.encode()
            msg.system_properties.message_id = uuid.uuid4().hex.upper()
            msg.system_properties.message_type = 1
            try:
                code = int(
                    channels[endpoint].SendMessage(request, metadata=md, timeout=5).status.code
                )
            except grpc.RpcError:
                code = -1
            if code == 20000:
                with self.lock:
                    self.acks.append(Ack(body, endpoint, time.monotonic()))
                seq += 1
                attempt = 0
                continue
            with self.lock:
                self.failures += 1
            attempt += 1
            endpoint = ""
            self.stop.wait(0.05)

    def snapshot(self) -> list[Ack]:
        with self.lock:
            return list(self.acks)


def stored_bodies(store: Path) -> Iterator[str]:
    """The bodies of a store's message records, file by file from disk, stopping at the
    first record that does not decode (a live store's tail being written)."""
    from broker.store.codec import BLANK_MAGIC_CODE, decode_message

    commitlog = store / "commitlog"
    if not commitlog.is_dir():
        return
    for path in sorted(commitlog.iterdir()):
        if not path.name.isdigit():
            continue
        buf = path.read_bytes()
        pos = 0
        while pos + 8 <= len(buf):
            total, magic = struct.unpack_from(">ii", buf, pos)
            if total <= 0 or magic == BLANK_MAGIC_CODE:
                break
            try:
                message = decode_message(buf, pos)
            except Exception:
                return
            yield bytes(message.body).decode(errors="replace")
            pos += total


def check_once(acks: list[Ack], store: Path) -> list[str]:
    """What is wrong with `store` for these acknowledged sends: each body exactly once."""
    counts: dict[str, int] = {}
    for body in stored_bodies(store):
        counts[body] = counts.get(body, 0) + 1
    problems = []
    for ack in acks:
        n = counts.get(ack.body, 0)
        if n != 1:
            problems.append(f"{ack.body} (acknowledged by {ack.endpoint}) stored {n} times")
    return problems


@dataclass
class Report:
    seed: int
    times_s: list[float] = field(default_factory=list)  # SIGKILL -> first ack on the new master
    acked: int = 0
    failures: int = 0
    problems: list[str] = field(default_factory=list)
    epochs: dict[int, list[int]] = field(default_factory=dict)  # epoch -> members promoted in it
    ackers: list[int] = field(default_factory=list)  # members in the order they acknowledged
    etcd_pause_s: float | None = None  # etcd down: the longest gap between two acks
    cuts: list[str] = field(default_factory=list)  # what each rejoining master cut, as printed
    logs: str = ""


def _wait(what: str, predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise FailoverFailed(f"timed out waiting for {what}")
        time.sleep(0.02)


def run(
    workdir: Path,
    *,
    kills: int,
    seed: int,
    restart_etcd_after: int | None = None,
    between_s: tuple[float, float] = (1.0, 3.0),
    progress: Callable[[str], None] = lambda _m: None,
    tls: MutualTls | None = None,
) -> Report:
    """Kill the master `kills` times (see the module docstring); `restart_etcd_after`:
    after that many kills, etcd itself is SIGKILLed and restarted once (its data kept);
    `tls`: etcd speaks TLS only and wants the brokers' client certificates."""
    rng = random.Random(seed)
    report = Report(seed)
    etcd = Etcd(workdir / "etcd", tls)
    etcd.start()
    client = etcd.client()
    members = {m: Member(m, workdir, etcd) for m in (1, 2)}
    by_endpoint = {b.endpoint: m for m, b in members.items()}
    sender = Sender(etcd)
    thread = threading.Thread(target=sender.run, name="failover-sender", daemon=True)

    def named() -> dict[str, Any] | None:
        try:
            return leader(client)
        except CoordinatorUnavailable:
            return None

    def acked_by(member: int, after: float) -> Ack | None:
        for ack in reversed(sender.snapshot()):
            if ack.at < after:
                return None
            if by_endpoint[ack.endpoint] == member:
                first = ack
                for earlier in reversed(sender.snapshot()):
                    if earlier.at < after:
                        break
                    if by_endpoint[earlier.endpoint] == member:
                        first = earlier
                return first
        return None

    try:
        for b in members.values():
            b.start()
        _wait("a master", lambda: named() is not None, 60)
        thread.start()
        _wait("the first acknowledgements", lambda: len(sender.snapshot()) >= 20, 60)
        for k in range(kills):
            time.sleep(rng.uniform(*between_s))
            current = named()
            if current is None:
                raise FailoverFailed("no master named before a kill")
            victim = members[int(current["member"])]
            before = sender.snapshot()
            killed_at = time.monotonic()
            victim.kill()
            progress(f"kill {k + 1}/{kills}: member {victim.member} (epoch {current['epoch']})")
            victim.start()  # as a supervisor would: it rejoins as a slave
            other = next(m for m in members if m != victim.member)
            _wait(
                "an acknowledgement by the new master",
                lambda: acked_by(other, killed_at) is not None,  # noqa: B023
                60,
            )
            first = acked_by(other, killed_at)
            assert first is not None
            report.times_s.append(first.at - killed_at)
            progress(
                f"  first acknowledgement on the new master after {first.at - killed_at:.2f} s"
            )
            # every send acknowledged before the kill is on the new master, exactly once
            report.problems += [
                f"after kill {k + 1}: {p}" for p in check_once(before, members[other].store)
            ]
            if restart_etcd_after is not None and k + 1 == restart_etcd_after:
                report.etcd_pause_s = _restart_etcd(etcd, sender, progress)
        time.sleep(1.0)
        sender.stop.set()
        thread.join(30)
    except FailoverFailed as exc:
        failed: FailoverFailed | None = exc
    else:
        failed = None
    finally:
        sender.stop.set()
        master = named()
        for b in members.values():
            b.stop()
        etcd.stop()
        report.logs = "".join(
            f"[member {m}] {line}" for m, b in members.items() for line in b.output[-200:]
        )
    if failed is not None:
        raise FailoverFailed(f"{failed} (seed {seed})\n{report.logs}")
    acks = sender.snapshot()
    report.acked = len(acks)
    report.failures = sender.failures
    for m, b in members.items():
        report.cuts += [f"member {m}: {line.strip()}" for line in b.output if "cut " in line]
        for epoch in b.epochs_won():
            report.epochs.setdefault(epoch, []).append(m)
    for ack in acks:
        member = by_endpoint[ack.endpoint]
        if not report.ackers or report.ackers[-1] != member:
            report.ackers.append(member)
    if master is not None:
        final = members[int(master["member"])]
        report.problems += [f"at the end: {p}" for p in check_once(acks, final.store)]
    return report


def _restart_etcd(etcd: Etcd, sender: Sender, progress: Callable[[str], None]) -> float:
    """SIGKILL etcd, keep it down 3 s (beyond the master's fence), start it again on its
    data; the longest pause between two acknowledgements around it."""
    down_at = time.monotonic()
    etcd.kill()
    progress("etcd SIGKILLed")
    time.sleep(3.0)
    etcd.start()
    progress("etcd restarted")
    up = len(sender.snapshot())
    _wait("an acknowledgement after etcd's restart", lambda: len(sender.snapshot()) > up + 5, 60)
    times = [a.at for a in sender.snapshot() if a.at >= down_at - 1]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]
