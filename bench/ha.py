"""HA suite: what replication costs a producer (docs/ha.md).

Three servers, started one after the other in the same run, each a real subprocess on
loopback with async flush; the framework's `Producer.send_async` (grpc transport) sends the
same count of 1 KiB messages to each with a window of 1000 in flight:

- single: one broker, no replication role;
- async_master: an ASYNC_MASTER with one slave (a send is answered once the master stored
  it; the slave copies it a moment later). Right after the last answer the slave's lag is
  read (`HaStatus`, bytes) and the time until it has caught up is measured;
- sync_master: a SYNC_MASTER with one slave (a send is answered once the slave has it);
- sync_master_auth: the same, both with access keys (`--credentials-file`): the HA link
  authenticates both ends at connect (docs/ha.md, "Who may replicate"); the client port
  then checks keys too, so the producer signs its calls;
- sync_master_tls: the same as sync_master, the master with a certificate (`--tls-cert`,
  self-signed by openssl) and the slave verifying it (`--ha-tls-ca`): the link is TLS,
  and so is the producer's connection to the master (one option serves both ports).

And `failover`: automatic failover (`--failover auto`, etcd started by the bench) of a
two-broker SYNC_MASTER group, both `--flush sync`, under a producer: the master is
SIGKILLed FAILOVER_KILLS times (2 with --quick) at seeded random moments and restarted at
once (it rejoins as a slave); reported: the time from each SIGKILL to the first send
acknowledged by the new master, p50 and max (`bench/_failover.py`). Skipped, with a note,
where there is no etcd binary.

Each case and round has its own stores. A full run repeats the three cases, interleaved,
ROUNDS times and shows each case's best round (all rounds are in the note); the figures are
compared with `single`, measured in the same run on the same machine.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from bench import _failover as failover
from bench import grpc as g
from bench import peers
from bench._common import Options, SuiteResult, format_table, progress
from bench._tls import self_signed
from protocol.ports import free_port

NAME = "ha"
DESCRIPTION = "replication: single broker vs async-master vs sync-master (send_async, 1 KiB)"
CASES = ("single", "async_master", "sync_master", "sync_master_auth", "sync_master_tls")
KEYS = {"bench-key": "bench-secret"}
CATCH_UP_TIMEOUT_S = 120.0
FAILOVER_KILLS = 5
ROUNDS = 3  # full runs: the three cases, interleaved, this many times; the best is shown


def _server(store: Path, home: Path, *extra: str) -> Any:
    argv = ["-m", "reliable_cli", "broker", "start", "--store", str(store), "--port", "0"]
    argv += ["--flush", "async", *extra]
    return g.serving(argv, home, f"server {' '.join(extra) or '(single)'}")


def _security(case: str, workdir: Path) -> tuple[list[str], list[str], dict[str, Any]]:
    """The case's options for the master, for the slave, and for the clients."""
    workdir.mkdir(parents=True, exist_ok=True)
    if case == "sync_master_auth":
        keys = workdir / "keys.json"
        keys.write_text(json.dumps(KEYS))
        both = ["--credentials-file", str(keys)]
        return both, both, {"access_key": "bench-key", "secret_key": "bench-secret"}
    if case == "sync_master_tls":
        cert, key = self_signed(workdir)
        master = ["--tls-cert", str(cert), "--tls-key", str(key)]
        return master, ["--ha-tls-ca", str(cert)], {"tls": True, "ca_file": str(cert)}
    return [], [], {}


@contextmanager
def topology(
    case: str, workdir: Path, home: Path
) -> Iterator[tuple[str, str | None, dict[str, Any]]]:
    """The case's servers; yields (the master's endpoint, the slave's or None, the
    clients' connection options)."""
    with ExitStack() as stack:
        store = workdir / case
        if case == "single":
            yield stack.enter_context(_server(store / "m", home)), None, {}
            return
        ha_port = free_port()
        role = "sync-master" if case.startswith("sync_master") else "async-master"
        on_master, on_slave, client = _security(case, store)
        master = stack.enter_context(
            _server(store / "m", home, "--role", role, "--ha-port", str(ha_port), *on_master)
        )
        slave = stack.enter_context(
            _server(
                store / "s",
                home,
                "--role",
                "slave",
                "--broker-id",
                "1",
                "--master",
                f"127.0.0.1:{ha_port}",
                "--ha-port",
                str(free_port()),
                *on_slave,
            )
        )
        yield master, slave, client


def _status(endpoint: str, **client: Any) -> dict[str, Any]:
    from reliable.admin import AdminClient

    admin = AdminClient(endpoint, **client)
    try:
        return admin.ha_status()
    finally:
        admin.close()


def _wait_connected(master: str, **client: Any) -> None:
    """A sync-master refuses sends until its slave is connected: wait for the link."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if _status(master, **client).get("slaves"):
            return
        time.sleep(0.1)
    raise g.CaseFailed("the slave did not connect to its master within 30 s")


def measure(case: str, n: int, workdir: Path) -> tuple[Any, dict[str, Any]]:
    """One round of `case`: the sends' timing, and for an async-master the slave's lag."""
    from reliable import Message, Producer

    extra: dict[str, Any] = {}
    with topology(case, workdir, workdir) as (master, slave, client):
        if slave is not None:
            _wait_connected(master, **client)
        topic = f"bench-ha-{case.replace('_', '-')}"
        with (
            g.started(g._grpc_transport(master, **client)) as transport,
            Producer(transport) as producer,
        ):
            producer.send(Message(topic, g.BODY))  # the route, the topic, the channel
            m = g.windowed(lambda: producer.send_async(Message(topic, g.BODY)), n)
            if case == "async_master":
                lag = extra["lag_bytes"] = _status(master).get("lag_bytes")
                started = time.monotonic()
                while (lag or 0) > 0 and time.monotonic() - started < CATCH_UP_TIMEOUT_S:
                    time.sleep(0.01)
                    lag = _status(master).get("lag_bytes")
                extra["catch_up_ms"] = round((time.monotonic() - started) * 1000)
    return m, extra


def run(opts: Options) -> SuiteResult:
    workdir = opts.workdir or Path.cwd()
    n = peers.counts(opts.quick).pipelined
    rounds = 1 if opts.quick else ROUNDS
    result = SuiteResult()
    rec = g.Recorder(result)
    best: dict[str, tuple[Any, dict[str, Any]]] = {}
    seen: dict[str, list[float]] = {case: [] for case in CASES}
    for r in range(rounds):  # the cases interleaved: a load change hits each alike
        for case in CASES:
            with rec.section(case):
                progress(f"round {r + 1}: {case}, {n} messages")
                m, extra = measure(case, n, workdir / f"round{r}")
                seen[case].append(m.msgs_s)
                progress(f"round {r + 1}: {case}: {m.msgs_s:,.0f} msg/s")
                if case not in best or m.msgs_s > best[case][0].msgs_s:
                    best[case] = (m, extra)
    for case in CASES:
        result.metrics[f"{case}_msgs_s"] = None
        if case not in best:
            continue
        m, extra = best[case]
        note = "send_async, window 1000; rounds " + ", ".join(f"{x:,.0f}" for x in seen[case])
        if "lag_bytes" in extra:
            result.metrics["async_master_lag_bytes_at_last_answer"] = extra["lag_bytes"]
            result.metrics["async_master_catch_up_ms"] = extra["catch_up_ms"]
            note += f"; slave lag at the last answer {extra['lag_bytes']} B"
        rec.add(case, m, note)
    single = result.metrics.get("single_msgs_s")
    for case in CASES[1:]:
        figure = result.metrics.get(f"{case}_msgs_s")
        if isinstance(single, int) and single and isinstance(figure, int):
            ratio = figure / single
            result.metrics[f"{case}_vs_single"] = round(ratio, 3)
            result.notes.append(f"{case}: {ratio:.2f}x the single broker's throughput")
    result.metrics["messages"] = n
    result.metrics["rounds"] = rounds
    result.notes.append(
        f"{len(g.BODY)} B bodies, {n} messages per case and round, {rounds} round(s), the "
        "best shown; servers: separate processes on loopback, async flush; a master's "
        "slave is a process of its own; sync_master_auth and sync_master_tls also sign or "
        "encrypt the producer's calls (the client port shares the options)"
    )
    _failover(opts, workdir, result, rec)
    result.errors.extend(rec.errors)
    return result


def _failover(opts: Options, workdir: Path, result: SuiteResult, rec: g.Recorder) -> None:
    """The `failover` case (see the module docstring)."""
    for key in ("failover_p50_s", "failover_max_s", "failover_times_s", "failover_kills"):
        result.metrics[key] = None
    if failover.etcd_binary() is None:
        result.notes.append("failover: not measured, no etcd binary (Debian: etcd-server)")
        return
    kills = 2 if opts.quick else FAILOVER_KILLS
    seed = int(time.time())
    with rec.section("failover"):
        progress(f"failover: {kills} kills of the master, seed {seed}")
        where = workdir / "failover"
        where.mkdir(parents=True, exist_ok=True)
        report = failover.run(where, kills=kills, seed=seed, progress=progress)
        if report.problems:
            raise failover.FailoverFailed("; ".join(report.problems[:3]))
        times = report.times_s
        result.metrics["failover_p50_s"] = round(failover.percentile(times, 0.5), 2)
        result.metrics["failover_max_s"] = round(max(times), 2)
        result.metrics["failover_times_s"] = " ".join(f"{t:.2f}" for t in times)
        result.metrics["failover_kills"] = kills
        result.notes.append(
            f"failover (seed {seed}): SIGKILL of the master -> first send acknowledged by "
            f"the new master, p50 {failover.percentile(times, 0.5):.2f} s, max "
            f"{max(times):.2f} s over {kills} kills ({', '.join(f'{t:.2f}' for t in times)}); "
            f"lease TTL {failover.TTL_S} s, {report.acked} sends acknowledged, each once"
        )


if __name__ == "__main__":
    print(format_table(DESCRIPTION, run(Options(quick="--quick" in sys.argv))))
