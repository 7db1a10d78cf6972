"""A local Apache RocketMQ 5 cluster: a name server and a proxy with its broker embedded.

Two JVMs, started from the jars `runtime.ensure_lib()` resolves:

    name server  (NamesrvStartup)             127.0.0.1:<namesrv>
    proxy        (ProxyStartup -pm local)     127.0.0.1:<grpc>      the endpoint clients use
      └ broker   (in the proxy's JVM)         127.0.0.1:<broker>    remoting, admin requests
                                              127.0.0.1:<broker-2>  its "fast" remoting port
                                              127.0.0.1:<ha>        replication (unused)
               proxy remoting                 127.0.0.1:<remoting>

Every port is a free port below the kernel's ephemeral range (`protocol.ports`; a start
that finds one taken anyway is made again on others) unless given. Everything the cluster
writes (store, configuration, logs) is under one directory. It is sized for tests: small heaps, the
serial collector, 64 MiB commitlog files, and the proxy's caches refreshed every second
so that a topic or group made a moment ago is served. Direct memory is not small: the
broker's timer stops for good when it runs out (`_jvm_options`).

`RocketMQCluster.start(directory)` returns once the proxy has answered a QueryRoute over
gRPC for a topic the broker registered; `stop()` ends both JVMs and deletes the store.
`start(..., sync_flush=True)` makes the broker acknowledge a send once it is on disk
(`flushDiskType=SYNC_FLUSH`); `jvm_options` are added after the defaults above, so that
they win (the bench runs the proxy with a larger heap and both JIT compilers).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType

from apache_rocketmq import admin
from apache_rocketmq.admin import MessageType
from apache_rocketmq.runtime import RuntimeUnavailable, ensure_lib, pinned_version
from protocol.ports import bindable, free_port

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
STATE_FILE = "cluster.json"
READY_TOPIC = "reliable_ready"
MiB = 1024 * 1024

# Heap sizes (MiB). The proxy's JVM holds the broker too.
NAMESRV_HEAP_MB = 96
PROXY_HEAP_MB = 320
DIRECT_MEMORY_MB = 1024


# a start whose JVM found a port taken (by another process since the pick) is made again
# on other ports, this many times in all
PORT_ATTEMPTS = 3
PORT_TAKEN = "Address already in use"

# how long a created topic may take to reach the name server (a loaded machine)
ROUTE_TIMEOUT_S = 60.0


class ClusterError(RuntimeError):
    """The cluster did not start, or stopped while it was being used."""


class NotStarted(ClusterError):
    """No cluster was started in this directory (no state file)."""


@dataclass(frozen=True)
class Ports:
    namesrv: int
    broker: int  # the broker also listens on broker - 2 (its fast remoting server)
    ha: int
    grpc: int
    remoting: int


def pick_ports(grpc: int = 0) -> Ports:
    """Free ports for a cluster, below the kernel's ephemeral range (`protocol.ports`), so
    that no connection opened meanwhile takes one before the JVMs bind them."""
    taken: set[int] = {grpc} if grpc else set()
    namesrv = free_port(taken)
    while True:  # the broker needs its port and the one two below it
        broker = free_port(taken)
        if broker > 1026 and broker - 2 not in taken and bindable(broker - 2):
            taken.add(broker - 2)
            break
    return Ports(
        namesrv=namesrv,
        broker=broker,
        ha=free_port(taken),
        grpc=grpc or free_port(taken),
        remoting=free_port(taken),
    )


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home, "bin", "java"), os.X_OK):
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise RuntimeUnavailable("Java is not installed (scripts/ensure-system.sh installs it)")
    return found


def _jvm_options(heap_mb: int, directory: Path, lib: Path, extra: Sequence[str] = ()) -> list[str]:
    return [
        f"-Xms{heap_mb}m",
        f"-Xmx{heap_mb}m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",  # C1 only: a faster start and less memory, enough for tests
        # a cap, not a reservation: the broker's timer gives each of its threads a direct
        # buffer of maxMessageSize (4 MiB) besides the proxy's gRPC buffers; at 128 MiB the
        # timer's threads ran out, its wheel stopped for good, and with it every delay
        # message, pop revive (change_invisible_duration, redelivery) and retry. Measured
        # (NMT "Other"): 65 MiB at start, 165 MiB after the differential scenarios (a 4 MiB
        # body among them), 200 MiB after them twice
        f"-XX:MaxDirectMemorySize={DIRECT_MEMORY_MB}m",
        "-XX:ReservedCodeCacheSize=64m",
        "-Xss512k",
        "-XX:-OmitStackTraceInFastThrow",
        "-Djava.net.preferIPv4Stack=true",
        f"-Duser.home={directory}",  # its logs go to <directory>/logs/rocketmqlogs
        *extra,
        "-cp",
        f"{lib}/*",
    ]


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _write_properties(path: Path, values: dict[str, object]) -> None:
    lines = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")


class RocketMQCluster:
    """A running (or stopped) local cluster; see the module docstring."""

    def __init__(
        self,
        directory: Path,
        ports: Ports,
        pids: dict[str, int],
        version: str,
        *,
        sync_flush: bool = False,
        broker_options: Mapping[str, object] | None = None,
    ) -> None:
        self.directory = directory
        self.ports = ports
        self.pids = pids
        self.version = version
        self.sync_flush = sync_flush
        self.broker_options = dict(broker_options or {})
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # -- addresses ---------------------------------------------------------------------

    @property
    def endpoint(self) -> str:
        """The proxy's gRPC endpoint, `host:port`, for any RocketMQ 5 client."""
        return f"{HOST}:{self.ports.grpc}"

    @property
    def broker_address(self) -> tuple[str, int]:
        return (HOST, self.ports.broker)

    @property
    def namesrv_address(self) -> str:
        return f"{HOST}:{self.ports.namesrv}"

    # -- admin ---------------------------------------------------------------------------

    def create_topic(
        self, topic: str, message_type: MessageType = MessageType.NORMAL, *, queues: int = 4
    ) -> None:
        """Create (or update) `topic`; returns once the name server routes it (up to
        `ROUTE_TIMEOUT_S`), so the proxy never answers a first client that it has none."""
        admin.create_topic(self.broker_address, topic, message_type, queues=queues)
        deadline = time.monotonic() + ROUTE_TIMEOUT_S
        while not admin.routed((HOST, self.ports.namesrv), topic):
            if time.monotonic() > deadline:
                raise ClusterError(f"the name server has no route for {topic!r} after creation")
            time.sleep(0.05)

    def create_group(
        self,
        group: str,
        *,
        orderly: bool = False,
        retry_max_times: int = 16,
        retry_delays_ms: Sequence[int] | None = None,
    ) -> None:
        admin.create_group(
            self.broker_address,
            group,
            orderly=orderly,
            retry_max_times=retry_max_times,
            retry_delays_ms=retry_delays_ms,
        )

    def update_broker_config(self, values: Mapping[str, object]) -> None:
        """Change broker settings while it runs (`mqadmin updateBrokerConfig`)."""
        admin.update_broker_config(self.broker_address, values)

    # -- life cycle ----------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        directory: Path,
        *,
        grpc_port: int = 0,
        version: str | None = None,
        tie_to_parent: bool = False,
        timeout_s: float = 120.0,
        sync_flush: bool = False,
        jvm_options: Sequence[str] = (),
        broker_options: Mapping[str, object] | None = None,
    ) -> RocketMQCluster:
        """Start a cluster whose files live under `directory` (created if needed).

        `tie_to_parent`: the JVMs are killed when this process dies, however it dies (for
        test sessions); otherwise they outlive it (for `python -m apache_rocketmq start`).
        `sync_flush`: `flushDiskType=SYNC_FLUSH` (a send is answered after its fsync).
        `jvm_options`: added to both JVMs' command lines after the defaults (later wins).
        `broker_options`: broker.conf settings added to (or replacing) the defaults, e.g.
        `{"transactionCheckInterval": 1000}`.
        """
        version = version or pinned_version()
        lib = ensure_lib(version)
        java = _java()
        directory = directory.resolve()
        (directory / "conf").mkdir(parents=True, exist_ok=True)
        (directory / "logs").mkdir(exist_ok=True)
        env = {**os.environ, "ROCKETMQ_HOME": str(directory)}
        env.pop("NAMESRV_ADDR", None)
        preexec: Callable[[], None] | None = _die_with_parent if tie_to_parent else None
        deadline = time.monotonic() + timeout_s
        attempt = 1
        while True:
            cluster = cls(
                directory,
                pick_ports(grpc_port),
                {},
                version,
                sync_flush=sync_flush,
                broker_options=broker_options,
            )
            try:
                cluster._launch(java, lib, jvm_options, env, preexec, deadline)
            except ClusterError as exc:
                # a port taken by another process between the pick and the JVM's bind:
                # again, on other ports
                if PORT_TAKEN not in cluster._logs() or attempt == PORT_ATTEMPTS:
                    raise
                log.warning("Apache RocketMQ found a port taken (%s); starting it again", exc)
                attempt += 1
                continue
            cluster.save_state()
            proxy = cluster.pids.get("proxy")
            if proxy is not None:
                _idle_spinners(proxy)
            return cluster

    def _logs(self) -> str:
        """What the JVMs printed (their .out files)."""
        return "".join(
            (self.directory / "logs" / f"{name}.out").read_text(errors="replace")
            for name in self._children
            if (self.directory / "logs" / f"{name}.out").exists()
        )

    def _launch(
        self,
        java: str,
        lib: Path,
        jvm_options: Sequence[str],
        env: dict[str, str],
        preexec: Callable[[], None] | None,
        deadline: float,
    ) -> None:
        """Write the configuration, start both JVMs, and wait until a topic is routed;
        on any failure both are stopped (the store kept) and the error raised."""
        directory, ports = self.directory, self.ports
        self._write_config()
        try:
            self._spawn(
                "namesrv",
                [
                    java,
                    *_jvm_options(NAMESRV_HEAP_MB, directory, lib, jvm_options),
                    "org.apache.rocketmq.namesrv.NamesrvStartup",
                    *("-c", str(directory / "conf" / "namesrv.properties")),
                ],
                env,
                preexec,
            )
            self._wait_port("namesrv", ports.namesrv, deadline)
            self._spawn(
                "proxy",
                [
                    java,
                    *_jvm_options(PROXY_HEAP_MB, directory, lib, jvm_options),
                    *("org.apache.rocketmq.proxy.ProxyStartup", "-pm", "local"),
                    *("-bc", str(directory / "conf" / "broker.conf")),
                    *("-pc", str(directory / "conf" / "rmq-proxy.json")),
                    *("-n", self.namesrv_address),
                ],
                env,
                preexec,
            )
            self._wait_port("proxy", ports.grpc, deadline)
            self._wait_routable(deadline)
        except BaseException:
            self.stop(remove=False)
            raise

    def _write_config(self) -> None:
        conf, store = self.directory / "conf", self.directory / "store"
        _write_properties(
            conf / "namesrv.properties",
            {
                "listenPort": self.ports.namesrv,
                # the name server takes a broker off every route 120 s after its last
                # heartbeat, scanning every 5 s. The bench stops (SIGSTOP) this cluster's
                # processes while it measures another server, for minutes on a loaded
                # machine; on SIGCONT the scan could run before the broker's next
                # heartbeat, and a client then found no route for its topic. The one
                # broker of this cluster is never replaced: no scan but the first
                "scanNotActiveBrokerInterval": 24 * 3600 * 1000,
            },
        )
        _write_properties(
            conf / "broker.conf",
            {
                "brokerClusterName": "DefaultCluster",
                "brokerName": "broker-a",
                "brokerId": 0,
                "brokerIP1": HOST,
                "namesrvAddr": self.namesrv_address,
                "listenPort": self.ports.broker,
                "haListenPort": self.ports.ha,
                "storePathRootDir": store,
                "storePathCommitLog": store / "commitlog",
                "mappedFileSizeCommitLog": 64 * MiB,
                "mappedFileSizeConsumeQueue": 30_000 * 20,  # 30,000 entries of 20 bytes
                "mappedFileSizeTimerLog": 16 * MiB,
                "flushDiskType": "SYNC_FLUSH" if self.sync_flush else "ASYNC_FLUSH",
                "autoCreateTopicEnable": True,
                "autoCreateSubscriptionGroup": True,
                "enablePropertyFilter": True,  # SQL92 filters
                # a shared disk's fill level is not this broker's business
                "diskMaxUsedSpaceRatio": 95,
                "diskSpaceWarningLevelRatio": 98,
                "diskSpaceCleanForciblyRatio": 97,
                # two cores under a full test suite: a send waits longer than 200 ms in
                # the queue before the broker answers "busy"
                "waitTimeMillsInSendQueue": 2000,
                # an idle broker burned about 40% of a core: the timer's flush (every 1 s
                # by default) compares and forces its whole 38 MiB wheel, 185 ms a time on
                # the C1-only JVM; every 30 s it costs about 1%. The flush is the wheel's
                # write-back only (delivery reads the mapping; shutdown flushes it)
                "timerFlushIntervalMs": 30_000,
                # the transaction metrics' flush thread spins, not sleeps, until its first
                # interval has passed: at the default, seconds of a core at every start
                "transactionMetricFlushInterval": 1_000,
                **self.broker_options,
            },
        )
        proxy = {
            "rocketMQClusterName": "DefaultCluster",
            "proxyMode": "LOCAL",
            "namesrvAddr": self.namesrv_address,
            "grpcServerPort": self.ports.grpc,
            "remotingListenPort": self.ports.remoting,
            "grpcShutdownTimeSeconds": 1,
            "grpcThreadPoolNums": 8,
            "enablePrintJstack": False,
            # topics and groups made by the tests are served a second later, not 20 s
            "topicRouteServiceCacheRefreshSeconds": 1,
            "topicConfigCacheRefreshSeconds": 1,
            "subscriptionGroupConfigCacheRefreshSeconds": 1,
        }
        (conf / "rmq-proxy.json").write_text(json.dumps(proxy, indent=2) + "\n")

    def _spawn(
        self, name: str, cmd: list[str], env: dict[str, str], preexec: Callable[[], None] | None
    ) -> None:
        with open(self.directory / "logs" / f"{name}.out", "wb") as out:
            proc = subprocess.Popen(
                cmd,
                cwd=self.directory,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the starting shell does not reach it
                preexec_fn=preexec,  # only prctl: no lock is taken between fork and exec
            )
        self._children[name] = proc
        self.pids[name] = proc.pid

    def _check_alive(self, name: str) -> None:
        proc = self._children.get(name)
        if proc is not None and proc.poll() is not None:
            out = (self.directory / "logs" / f"{name}.out").read_text(errors="replace")
            tail = " | ".join(out.strip().splitlines()[-5:])
            raise ClusterError(f"{name} exited with {proc.returncode}: {tail}")

    def _wait_port(self, name: str, port: int, deadline: float) -> None:
        """Until `name` listens on `port`, while every JVM started so far lives: a name
        server that died on a port taken by another process must not pass unseen while
        that process answers on its port."""
        while True:
            for started in self._children:
                self._check_alive(started)
            with contextlib.suppress(OSError), socket.create_connection((HOST, port), 0.5):
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{name} did not listen on {HOST}:{port} in time")
            time.sleep(0.1)

    def _wait_routable(self, deadline: float) -> None:
        """Until the proxy routes a topic the broker registered: the whole path works."""
        while True:
            self._check_alive("proxy")
            try:
                self.create_topic(READY_TOPIC, queues=1)
                break
            except admin.AdminError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        while True:
            self._check_alive("proxy")
            status = query_route(self.endpoint, READY_TOPIC)
            if status == "OK":
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"the proxy at {self.endpoint} answers QueryRoute: {status}")
            time.sleep(0.2)

    def stop(self, *, remove: bool = True, grace_s: float = 5.0) -> None:
        """End the proxy, then the name server (SIGTERM, SIGKILL after `grace_s`); with
        `remove`, delete the store (logs stay) and the state file."""
        for name in ("proxy", "namesrv"):
            pid = self.pids.get(name)
            if pid is not None and self._is_ours(pid):
                _terminate(pid, self._children.get(name), grace_s)
        if remove:
            shutil.rmtree(self.directory / "store", ignore_errors=True)
            (self.directory / STATE_FILE).unlink(missing_ok=True)

    def _is_ours(self, pid: int) -> bool:
        """The pid is still one of this cluster's JVMs (not a recycled pid)."""
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        return f"-Duser.home={self.directory}".encode() in cmdline

    def running(self) -> dict[str, bool]:
        return {name: self._is_ours(pid) for name, pid in self.pids.items()}

    def rss_bytes(self) -> dict[str, int]:
        """Resident memory of each JVM (0 when it is not running)."""
        sizes = {}
        for name, pid in self.pids.items():
            sizes[name] = 0
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        sizes[name] = int(line.split()[1]) * 1024
        return sizes

    # -- state, for the command line -----------------------------------------------------

    def save_state(self) -> None:
        state = {"version": self.version, "ports": asdict(self.ports), "pids": self.pids}
        (self.directory / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    @classmethod
    def from_state(cls, directory: Path) -> RocketMQCluster:
        directory = directory.resolve()
        try:
            state = json.loads((directory / STATE_FILE).read_text())
        except FileNotFoundError:
            raise NotStarted(f"no cluster started in {directory}") from None
        return cls(directory, Ports(**state["ports"]), dict(state["pids"]), state["version"])

    def __enter__(self) -> RocketMQCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _terminate(pid: int, child: subprocess.Popen[bytes] | None, grace_s: float) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if child is not None:
            if child.poll() is not None:
                return
        elif not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if child is not None:
        child.wait()


def query_route(endpoint: str, topic: str, *, timeout_s: float = 3.0) -> str:
    """The status name the proxy answers a QueryRoute for `topic` with ("OK" when routed),
    or the gRPC error's code name when it does not answer in-band."""
    import grpc

    from protocol.pb import definition_pb2, service_pb2, service_pb2_grpc

    host, port = endpoint.rsplit(":", 1)
    request = service_pb2.QueryRouteRequest(
        topic=definition_pb2.Resource(name=topic),
        endpoints=definition_pb2.Endpoints(
            scheme=definition_pb2.AddressScheme.IPv4,
            addresses=[definition_pb2.Address(host=host, port=int(port))],
        ),
    )
    metadata = (
        ("x-mq-client-id", f"reliable-interop@{os.getpid()}"),
        ("x-mq-language", "PYTHON"),
        ("x-mq-protocol", "GRPC_V2"),
        ("x-mq-client-version", "5.1.2"),
    )
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        try:
            response = stub.QueryRoute(request, metadata=metadata, timeout=timeout_s)
        except grpc.RpcError as exc:
            return str(exc.code().name)
    return str(definition_pb2.Code.Name(response.status.code))


# threads of the broker that spin rather than sleep once they have nothing to do: the
# transaction op batch (TransactionalOpBatchService) takes the last write time of an op
# queue with nothing pending as the next wake-up, which is past, so from the first
# transaction ended on it the thread takes a whole core for the broker's life. Run at
# SCHED_IDLE it only takes a core nobody else wants; its work (writing the op records of
# ended transactions, in batches) is light and not latency-bound.
SPINNING_THREADS = ("TransactionalOp",)


def _idle_spinners(pid: int) -> None:
    """Give the JVM `pid`'s spinning threads (`SPINNING_THREADS`) the idle scheduling
    class. Nothing when /proc or the policy is not available."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tasks:
        try:
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
            if name.startswith(SPINNING_THREADS):
                os.sched_setscheduler(int(tid), os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError):
            continue


@contextlib.contextmanager
def running_cluster(
    directory: Path,
    *,
    grpc_port: int = 0,
    version: str | None = None,
    sync_flush: bool = False,
    jvm_options: Sequence[str] = (),
    broker_options: Mapping[str, object] | None = None,
) -> Iterator[RocketMQCluster]:
    """A cluster for the length of a `with` block, tied to this process. Its store is
    thrown away at the end, so the JVMs get one second to stop before they are killed."""
    cluster = RocketMQCluster.start(
        directory,
        grpc_port=grpc_port,
        version=version,
        tie_to_parent=True,
        sync_flush=sync_flush,
        jvm_options=jvm_options,
        broker_options=broker_options,
    )
    try:
        yield cluster
    finally:
        cluster.stop(grace_s=1.0)
