"""The benchmark runner's contract (not its figures): suites are discovered by file name,
`--json` ends with one JSON object holding the agreed keys, a peer that cannot be measured
is reported and never stops the run, and the no-work stub answers the official client."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import _common as bench_common
from bench import burst as burst_suite
from bench import grpc as grpc_suite
from bench import peers
from bench import rocketmq as rocketmq_suite
from bench.__main__ import discover
from bench._common import Measured, Options, Row, SuiteResult, format_table, percentiles_ms
from protocol.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {
    "floor_msgs_s",
    "put_async_1k_msgs_s",
    "put_async_16k_mb_s",
    "put_sync_64_msgs_s",
    "sync_64_msgs_per_fsync",
    "dispatch_msgs_s",
    "read_msgs_s",
}
PEER_KEYS = {
    f"{peer}_{case}_msgs_s"
    for peer in ("rabbitmq", "nats")
    for case in ("publish_each", "publish_pipelined", "consume_ack")
} | {f"{peer}_publish_each_{q}_ms" for peer in ("rabbitmq", "nats") for q in ("p50", "p99")}
GRPC_KEYS = {
    "framework_send_msgs_s",
    "framework_send_sync_flush_msgs_s",
    "framework_send_pipelined_msgs_s",
    "framework_receive_ack_msgs_s",
    "official_send_msgs_s",
    "official_send_async_msgs_s",
    "official_receive_ack_msgs_s",
    "embedded_send_msgs_s",
    "embedded_receive_ack_msgs_s",
    "framework_send_p50_ms",
    "framework_send_p99_ms",
    "framework_send_sync_flush_p50_ms",
    "framework_send_sync_flush_p99_ms",
    "official_send_p50_ms",
    "official_send_p99_ms",
    "stub_official_send_msgs_s",
    "stub_official_receive_ack_msgs_s",
} | PEER_KEYS


def _bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- the runner


def test_suites_are_the_modules_without_a_leading_underscore() -> None:
    suites = discover()
    assert {"grpc", "peers", "store", "reconcile", "burst"} <= set(suites)
    assert not [s for s in suites if s.startswith("_")]  # _common, _stub are not suites


def test_runner_lists_suites_and_rejects_unknown_ones() -> None:
    proc = _bench("--help", timeout=60)
    assert proc.returncode == 0
    for name in ("store", "grpc", "peers", "all"):
        assert name in proc.stdout
    proc = _bench("nope", timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr


@pytest.mark.slow
def test_store_suite_quick_json(tmp_path: Path) -> None:
    proc = _bench("store", "--quick", "--json", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    metrics = json.loads(lines[-1])
    assert isinstance(metrics, dict)
    assert not REQUIRED - metrics.keys(), REQUIRED - metrics.keys()
    for key in REQUIRED:
        assert isinstance(metrics[key], int | float) and metrics[key] > 0, key
    assert "floor 1 KiB" in proc.stdout  # the table is printed too
    assert "[bench] " in proc.stderr and "[bench] " not in proc.stdout  # progress on stderr
    assert list(tmp_path.iterdir()) == []  # the suite's files are removed


@pytest.mark.slow
def test_restart_suite_quick_json(tmp_path: Path) -> None:
    """Every size's keys are there: the quick sizes measured, the others null."""
    from bench import restart

    proc = _bench("restart", "--quick", "--json", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(restart.metric_keys()) <= metrics.keys()
    for mib in restart.KEYS_MIB:
        for what in ("serving_s", "first_send_s"):
            value = metrics[f"restart_{mib}mib_{what}"]
            if mib in restart.QUICK_SIZES_MIB:
                assert isinstance(value, float) and 0 < value < 120, (mib, what, value)
            else:
                assert value is None, (mib, what)
    assert "serving s (median)" in proc.stdout  # the table
    assert list(tmp_path.iterdir()) == []


def test_peers_suite_quick_json_measures_both_peers(tmp_path: Path) -> None:
    """Against the machine's RabbitMQ and NATS: every peer figure present and positive,
    the queue and the stream it made are gone afterwards."""
    proc = _bench("peers", "--quick", "--json", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not PEER_KEYS - metrics.keys(), PEER_KEYS - metrics.keys()
    for key in PEER_KEYS:
        assert isinstance(metrics[key], int | float) and metrics[key] > 0, key
    assert "rabbitmq_error" not in metrics and "nats_error" not in metrics
    assert "rabbitmq_publish_pipelined" in proc.stdout  # the table
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(600)  # about a minute alone; several on a busy 2-core machine
def test_grpc_suite_quick_json_carries_the_agreed_keys(tmp_path: Path) -> None:
    proc = _bench("grpc", "--quick", "--json", "--dir", str(tmp_path), timeout=540)
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, (metrics.get("errors"), proc.stderr[-2000:])
    assert not GRPC_KEYS - metrics.keys(), GRPC_KEYS - metrics.keys()
    for key in GRPC_KEYS:
        assert isinstance(metrics[key], int | float) and metrics[key] > 0, key
    assert "ours beside the peers" in proc.stdout  # the comparison table
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.timeout(1200)  # two Apache RocketMQ starts, four JVM clients: minutes
def test_rocketmq_suite_quick_json_measures_both_servers(tmp_path: Path) -> None:
    """Apache RocketMQ and our server, the same clients against each: every case's figure
    on both sides, the native wire's, and the CPU per message of client and server."""
    proc = _bench("rocketmq", "--quick", "--json", "--dir", str(tmp_path), timeout=1100)
    sys.stderr.write(proc.stderr)  # shown on a failure: a stalled case's stacks (`stalled`)
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, (metrics.get("errors"), proc.stderr[-2000:])
    assert set(rocketmq_suite.metric_keys()) <= metrics.keys()
    assert "rocketmq_error" not in metrics
    for case in rocketmq_suite.client_cases():
        for server in ("rocketmq", "ours"):
            for what in ("msgs_s", "client_cpu_us", "server_cpu_us"):
                value = metrics[f"{server}_{case}_{what}"]
                assert isinstance(value, int | float) and value > 0, (server, case, what)
    for case in rocketmq_suite.client_cases():  # the official clients through the gateway
        if case.startswith(rocketmq_suite.GATEWAY_CLIENTS):
            for what in ("msgs_s", "client_cpu_us", "server_cpu_us"):
                value = metrics[f"gateway_{case}_{what}"]
                assert isinstance(value, int | float) and value > 0, (case, what)
    assert "gateway_error" not in metrics
    for case in rocketmq_suite.WIRE_CASES:
        assert metrics[f"ours_{case}_msgs_s"] > 0, case
    assert metrics["rocketmq_java_send_p50_ms"] > 0 and metrics["ours_java_send_p99_ms"] > 0
    assert metrics["targets_met"] + metrics["targets_short"] == len(
        rocketmq_suite.client_cases()
    ) + len(rocketmq_suite.KINDS)
    assert "our server beside Apache RocketMQ 5" in proc.stdout  # the target rows
    assert list(tmp_path.iterdir()) == []


def test_rocketmq_targets_hold_ours_to_apache_and_the_wire_to_its_best_client() -> None:
    metrics: dict[str, object] = {
        "rocketmq_java_send_msgs_s": 100,
        "ours_java_send_msgs_s": 100,  # level: met
        "rocketmq_framework_send_msgs_s": 300,
        "ours_framework_send_msgs_s": 250,  # behind: short
        "ours_framework_wire_send_msgs_s": 599,  # under 2x the best (framework, 300): short
        "rocketmq_java_send_async_msgs_s": 1000,
        "ours_java_send_async_msgs_s": 500,
        "gateway_java_send_async_msgs_s": 1100,  # behind the gateway: ahead, met
        "rocketmq_java_receive_ack_msgs_s": 1000,
        "ours_java_receive_ack_msgs_s": 900,
        "gateway_java_receive_ack_msgs_s": 800,  # both behind: short
        "ours_framework_wire_send_pipelined_msgs_s": 2000,  # 2x the best: met
    }
    lines, met, short = rocketmq_suite.targets(metrics)
    rows = {line.split()[0]: line for line in lines if line.strip()}
    assert rows["java_send"].endswith("(met)") and rows["framework_send"].endswith("(short)")
    assert rows["java_send_async"].endswith("(met (gateway))")
    assert "1.10x" in rows["java_send_async"]
    assert rows["java_receive_ack"].endswith("(short)") and "0.90x" in rows["java_receive_ack"]
    assert rows["official_send"].endswith(">= 1x")  # not measured: no verdict
    one = next(line for line in lines if line.startswith("one at a time"))
    assert "framework_send" in one and one.endswith("(short)")
    pipelined = next(line for line in lines if line.startswith("pipelined"))
    assert "java_send_async" in pipelined and pipelined.endswith("(met)")
    assert (met, short) == (3, 3)


def test_grpc_only_runs_the_chosen_group_and_keeps_every_key(tmp_path: Path) -> None:
    """`--only` keeps the JSON's shape: every agreed key is there, null when not run."""
    proc = _bench("grpc", "--quick", "--json", "--only", "^embedded_", "--dir", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not GRPC_KEYS - metrics.keys(), GRPC_KEYS - metrics.keys()
    for key in ("embedded_send_msgs_s", "embedded_receive_ack_msgs_s"):
        assert isinstance(metrics[key], int) and metrics[key] > 0, key
    # what the machine's figures stand on, measured in the same run
    assert 0 < metrics["machine_python_loop_s"] < 60
    # sampled before and after the pass: the machine's own spread beside the figures
    assert (
        0
        < metrics["machine_python_loop_min_s"]
        <= metrics["machine_python_loop_s"]
        <= metrics["machine_python_loop_max_s"]
    )
    assert 0 < metrics["machine_fdatasync_p50_ms"] < 1000
    assert 0 < metrics["machine_fdatasync_apart_p50_ms"] < 1000
    assert "machine: a 10-million-iteration Python loop" in proc.stdout
    for key in GRPC_KEYS - {"embedded_send_msgs_s", "embedded_receive_ack_msgs_s"}:
        assert metrics[key] is None, key
    assert "errors" not in metrics


@pytest.mark.timeout(300)
def test_burst_suite_quick_json_carries_every_key(tmp_path: Path) -> None:
    """The burst case over the native wire (`--only`): its figures measured, every message
    stored once; the other targets' keys present, null."""
    proc = _bench("burst", "--quick", "--json", "--only", "^burst_wire$", "--dir", str(tmp_path))
    metrics = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 0, (metrics.get("errors"), proc.stderr[-2000:])
    assert not set(burst_suite.METRIC_NAMES) - metrics.keys()
    assert metrics["burst_wire_stored_once"] == 2000 and metrics["burst_wire_duplicates"] == 0
    for key in ("first_answer_ms", "p99_ms", "seconds"):
        assert isinstance(metrics[f"burst_wire_{key}"], int | float), key
        assert metrics[f"burst_wire_{key}"] > 0, key
    assert metrics["burst_grpc_p99_ms"] is None and metrics["burst_nats_p99_ms"] is None
    assert list(tmp_path.iterdir()) == []


def test_only_rejects_a_bad_pattern() -> None:
    proc = _bench("grpc", "--only", "(", timeout=60)
    assert proc.returncode == 2 and "--only" in proc.stderr


# --- peers: started when absent, reported when unreachable


def test_a_peer_not_running_is_started_measured_and_stopped(tmp_path: Path) -> None:
    port = free_port()
    nats = peers.Peer("nats", "NATS JetStream", "127.0.0.1", port)
    result = SuiteResult()
    peers.measure(peers.Counts(each=20, pipelined=200), tmp_path, result, peers=(nats,))
    assert "nats_error" not in result.metrics, result.metrics.get("nats_error")
    for case in peers.CASES:
        assert isinstance(result.metrics[f"nats_{case}_msgs_s"], int)
    assert not peers.port_open("127.0.0.1", port)  # the server it started is gone


@pytest.fixture
def not_amqp() -> Iterator[int]:
    """A port that accepts connections and closes them at once: no broker behind it."""
    server = socket.create_server(("127.0.0.1", 0))
    port = int(server.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield port
    stop.set()
    thread.join(5)
    server.close()


def test_a_peer_that_cannot_be_measured_is_marked_and_the_others_still_run(
    tmp_path: Path, not_amqp: int
) -> None:
    broken = peers.Peer("rabbitmq", "RabbitMQ", "127.0.0.1", not_amqp)
    result = SuiteResult()
    peers.measure(
        peers.Counts(each=10, pipelined=100), tmp_path, result, peers=(broken, peers.NATS)
    )
    assert isinstance(result.metrics["rabbitmq_error"], str)
    for case in peers.CASES:
        assert result.metrics[f"rabbitmq_{case}_msgs_s"] is None
        assert isinstance(result.metrics[f"nats_{case}_msgs_s"], int)
    table = format_table("peers", result)
    assert table.count("not measured") == len(peers.CASES)
    json.dumps(result.metrics)  # null figures still make one JSON object


# --- the comparison and the figures' arithmetic


def test_comparison_puts_each_case_beside_its_peer_and_tolerates_missing_figures() -> None:
    metrics: dict[str, object] = {
        "framework_send_pipelined_msgs_s": 20_000,
        "nats_publish_pipelined_msgs_s": 10_000,
        "official_send_msgs_s": 450,
        "stub_official_send_msgs_s": 500,
        "framework_receive_ack_msgs_s": None,
    }
    lines = grpc_suite.comparison_table(metrics)
    pipelined = next(
        line
        for line in lines
        if line.startswith("framework_send_pipelined ") and "nats_publish_pipelined" in line
    )
    assert "2.00x" in pipelined and "(met)" in pipelined
    cap = next(
        line for line in lines if line.startswith("official_send ") and "stub_official_send" in line
    )
    assert "90%" in cap and "(met)" in cap
    receive = next(
        line
        for line in lines
        if line.startswith("framework_receive_ack ") and "nats_consume_ack" in line
    )
    assert " - " in receive and "(met)" not in receive and "(short)" not in receive


def test_sync_flush_target_needs_the_ratio_the_rate_and_the_latency() -> None:
    def verdict(rate: float, p50: float) -> str:
        metrics = {
            "framework_wire_send_sync_flush_msgs_s": rate,
            "framework_wire_send_sync_flush_p50_ms": p50,
            "rabbitmq_publish_each_msgs_s": 500,
        }
        line = next(
            line
            for line in grpc_suite.comparison_table(metrics)
            if line.startswith("framework_wire_send_sync_flush ") and "rabbitmq" in line
        )
        return "met" if "(met)" in line else "short"

    assert verdict(2_100, 0.55) == "met"
    assert verdict(1_900, 0.55) == "short"  # 3.8x RabbitMQ, yet under 2,000/s
    assert verdict(2_100, 0.70) == "short"  # fast enough, yet the median is too slow


def test_percentiles_and_rates() -> None:
    p50, p99 = percentiles_ms([i / 1000 for i in range(1, 101)])  # 1..100 ms
    assert (p50, p99) == (51.0, 100.0)
    assert percentiles_ms([]) == (0.0, 0.0)
    m = Measured(count=500, seconds=0.25, payload_bytes=500 * 1024)
    assert m.msgs_s == 2000 and m.mb_s == pytest.approx(2.048)
    row = Row("x", 0.0, 0.0, "why", missing=True)
    assert "-" in format_table("t", SuiteResult(rows=[row]))


def test_a_failing_case_is_marked_and_the_run_goes_on() -> None:
    result = SuiteResult()
    rec = grpc_suite.Recorder(result)
    with rec.section("a_send", "a_receive"):
        rec.add("a_send", Measured(10, 1.0, 10), "ok")
        raise grpc_suite.CaseFailed("receive came up short")
    assert [r.name for r in result.rows] == ["a_send", "a_receive"]
    assert result.rows[1].missing and "receive came up short" in result.rows[1].note
    assert rec.errors == ["a_receive: CaseFailed: receive came up short"]


def test_a_stalled_case_leaves_every_thread_stack_and_each_server_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A stall seen once in a long run must leave where each thread waited: here a thread
    parked on an event, and a server process stopped (SIGSTOP), as `stop_the_others` leaves
    the servers not measured."""
    parked = threading.Event()
    waiter = threading.Thread(target=parked.wait, name="parked-waiter", daemon=True)
    waiter.start()
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    grpc_suite.SERVER_PIDS["127.0.0.1:1"] = server.pid
    try:
        server.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while grpc_suite.process_state(server.pid) != "T":  # a signal lands later
            assert time.monotonic() < deadline, "the server never stopped"
            time.sleep(0.01)
        exc = grpc_suite.stalled("no send completed for 60 s")
    finally:
        grpc_suite.SERVER_PIDS.pop("127.0.0.1:1")
        server.kill()
        server.wait()
        parked.set()
    assert isinstance(exc, grpc_suite.CaseFailed) and str(exc) == "no send completed for 60 s"
    err = capsys.readouterr().err
    assert f"process {server.pid}: state T" in err
    assert '"parked-waiter"' in err and "Event.wait" in err  # py-spy's dump of this process
    assert f"--- stacks of process {server.pid}" not in err  # stopped: not the one measured


def test_a_stalled_case_dumps_a_running_jvm_s_threads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The Java client (a case's client process) and Apache RocketMQ's JVMs: `jcmd`."""
    source = tmp_path / "Parked.java"
    source.write_text(
        "public class Parked { public static void main(String[] a) throws Exception {"
        ' System.out.println("up"); System.out.flush(); Thread.sleep(60_000); } }'
    )
    jvm = subprocess.Popen(["java", str(source)], stdout=subprocess.PIPE, text=True)
    try:
        assert jvm.stdout is not None and jvm.stdout.readline() == "up\n"
        exc = grpc_suite.stalled("the Java client answered nothing in 240 s", jvm.pid)
    finally:
        jvm.kill()
        jvm.wait()
    assert str(exc) == "the Java client answered nothing in 240 s"
    err = capsys.readouterr().err
    assert f"process {jvm.pid}: state " in err and f"--- stacks of process {jvm.pid}" in err
    assert "java.lang.Thread.sleep" in err and "Parked.main" in err


# --- the stub server


def test_official_cases_alternate_between_the_cap_and_our_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each official case runs against the cap, then at once against the other server,
    before the next case starts: a case and its cap measured minutes apart would differ
    by what the machine's speed did in between."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # the official client logs under $HOME
    result = SuiteResult()
    rec = grpc_suite.Recorder(result)
    with grpc_suite.stub_server(home) as cap, grpc_suite.stub_server(home) as other:
        grpc_suite.official(
            {"stub_official": cap, "official": other}, peers.Counts(each=3, pipelined=40), rec
        )
    assert rec.errors == []
    assert [row.name for row in result.rows] == [
        "stub_official_send",
        "official_send",
        "stub_official_send_async",
        "official_send_async",
        "stub_official_receive_ack",
        "official_receive_ack",
    ]
    assert all(result.metrics[f"{row.name}_msgs_s"] > 0 for row in result.rows)
    # both processes' CPU a message, read over each case (the counts here are too small
    # for the figures themselves to mean anything: clock ticks of 10 ms)
    for row in result.rows:
        assert isinstance(result.metrics.get(f"{row.name}_client_cpu_us"), float)
        assert isinstance(result.metrics.get(f"{row.name}_server_cpu_us"), float)
        assert "CPU/msg client" in row.note and ", server " in row.note


def test_stub_server_answers_the_official_client(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # the official client logs under $HOME
    from rocketmq import (
        ClientConfiguration,
        Credentials,
        FilterExpression,
        Message,
        Producer,
        SimpleConsumer,
    )

    with grpc_suite.stub_server(home) as endpoint:
        config = ClientConfiguration(endpoint, Credentials())
        producer = Producer(config, ["stub-topic"])
        consumer = SimpleConsumer(
            config, "stub-group", {"stub-topic": FilterExpression("*")}, await_duration=2
        )
        producer.startup()
        consumer.startup()
        try:
            message = Message()
            message.topic, message.body = "stub-topic", b"x" * 1024
            receipts = [producer.send(message), producer.send_async(message).result(10)]
            assert all(r.message_id for r in receipts)
            assert receipts[0].message_id != receipts[1].message_id  # echoed, per send
            received = consumer.receive(32, 30)
            assert len(received) == 32
            assert all(m.body == b"x" * 1024 and not m.corrupted for m in received)
            for m in received[:3]:
                consumer.ack(m)  # raises on a non-OK status
        finally:
            producer.shutdown()
            consumer.shutdown()


def test_repeated_passes_report_each_figure_as_its_median() -> None:
    """Three passes: each rate, latency and share of the cap is the middle pass's; a row
    is the pass with the median rate, saying every pass's rate; a figure one pass could
    not measure is the median of the others; a failure in any pass fails the run."""
    rates = [(900, 1_500), (1_200, 1_400), (1_000, 1_600)]
    passes = []
    for i, (ours, cap) in enumerate(rates):
        p = SuiteResult()
        p.rows.append(Row("official_send", ours, ours / 1000, f"pass {i}"))
        p.metrics.update(
            official_send_msgs_s=ours,
            stub_official_send_msgs_s=cap,
            official_send_p50_ms=[0.9, 0.5, 0.7][i],
            nats_consume_ack_msgs_s=None if i == 1 else [30_000, 0, 20_000][i],
        )
        passes.append(p)
    passes[2].errors.append("embedded_send: boom")
    merged = grpc_suite.median_of(passes)
    [row] = merged.rows
    assert (row.msgs_s, row.note) == (1_000, "pass 2; passes: 900, 1,000, 1,200")
    assert merged.metrics["official_send_msgs_s"] == 1_000
    assert merged.metrics["stub_official_send_msgs_s"] == 1_500
    assert merged.metrics["official_send_pct_of_cap"] == 66.7  # of the medians
    assert merged.metrics["official_send_p50_ms"] == 0.7
    assert merged.metrics["nats_consume_ack_msgs_s"] == 20_000  # lower median of two
    assert merged.errors == ["embedded_send: boom"]


def test_rocketmq_passes_judge_the_targets_on_each_sides_median(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--repeat on the rocketmq suite: every pass on servers of its own (a directory each),
    Apache RocketMQ's figure and ours each the median of the passes, the targets judged on
    the medians, and how many each pass met said beside them."""
    figures = iter([(1_000, 1_100), (1_200, 1_000), (1_100, 1_150)])  # Apache, gateway
    dirs: list[Path] = []

    def one_pass(opts: object, workdir: Path, home: Path, n: object) -> SuiteResult:
        dirs.append(workdir)
        apache, gateway = next(figures)
        result = SuiteResult()
        result.metrics.update(
            rocketmq_framework_send_msgs_s=apache, gateway_framework_send_msgs_s=gateway
        )
        return result

    monkeypatch.setattr(rocketmq_suite, "one_pass", one_pass)
    monkeypatch.setattr(rocketmq_suite, "python_loop_s", lambda: [0.3])
    monkeypatch.setattr(bench_common, "python_loop_s", lambda: [0.3])
    monkeypatch.setattr(rocketmq_suite, "fdatasync_p50_ms", lambda where: 0.1)
    monkeypatch.setenv("HOME", str(tmp_path))  # the suite points HOME at its own directory
    monkeypatch.delenv("RELIABLE_CACHE_DIR", raising=False)  # and sets this one
    result = rocketmq_suite.run(Options(workdir=tmp_path, repeat=3))
    assert dirs == [tmp_path / f"pass-{i}" for i in (1, 2, 3)]
    assert result.metrics["rocketmq_framework_send_msgs_s"] == 1_100
    assert result.metrics["gateway_framework_send_msgs_s"] == 1_100
    assert result.metrics["targets_met_each_pass"] == [1, 0, 1]
    assert (result.metrics["targets_met"], result.metrics["targets_short"]) == (1, 0)
    assert result.metrics["passes"] == 3
    [line] = [n for n in result.notes if n.startswith("framework_send ")]
    assert "1.00x" in line and "met (gateway)" in line


def test_repeat_must_be_positive() -> None:
    proc = _bench("grpc", "--repeat", "0", timeout=60)
    assert proc.returncode == 2 and "--repeat: must be at least 1" in proc.stderr


def test_stub_work_must_not_be_negative() -> None:
    proc = _bench("grpc", "--stub-work-us", "-1", timeout=60)
    assert proc.returncode == 2 and "--stub-work-us: must be at least 0" in proc.stderr


def test_the_stub_spends_the_work_it_is_given_on_each_send_and_ack() -> None:
    """`--work-us`: each SendMessage and AckMessage holds the loop that long before it
    answers (a lower bound: a busy wait cannot end early), with the same answer."""
    import asyncio
    import time

    from bench._stub import StubMessagingService
    from protocol.pb import service_pb2

    send = service_pb2.SendMessageRequest()
    send.messages.add().system_properties.message_id = "01ABC"
    ack = service_pb2.AckMessageRequest()
    ack.entries.add(message_id="01ABC", receipt_handle="h")

    async def timed(call: object) -> float:
        started = time.perf_counter()
        await call  # type: ignore[misc]
        return time.perf_counter() - started

    async def main() -> None:
        stub = StubMessagingService(work_us=30_000)
        assert await timed(stub.SendMessage(send, None)) >= 0.03
        assert await timed(stub.AckMessage(ack, None)) >= 0.03
        assert stub.sent == stub.acked == 1
        for worker in (stub, StubMessagingService()):
            response = await worker.SendMessage(send, None)
            assert [e.message_id for e in response.entries] == ["01ABC"]

    asyncio.run(main())


def test_a_stub_made_to_work_gives_no_share_of_the_cap_and_no_verdict() -> None:
    """With `--stub-work-us`, the stub's figures are not the cap: no `_pct_of_cap`, and
    its comparisons say so instead of met or short; the peers' verdicts stand."""
    metrics: dict[str, object] = {
        "framework_send_pipelined_msgs_s": 20_000,
        "nats_publish_pipelined_msgs_s": 10_000,
        "official_send_msgs_s": 450,
        "stub_official_send_msgs_s": 500,
        "stub_work_us": 30.0,
    }
    grpc_suite.shares_of_cap(metrics)
    assert metrics["official_send_pct_of_cap"] is None
    lines = grpc_suite.comparison_table(metrics)
    cap = next(
        line for line in lines if line.startswith("official_send ") and "stub_official_send" in line
    )
    assert "90%" in cap and "no verdict: the stub worked" in cap and "(met)" not in cap
    pipelined = next(
        line
        for line in lines
        if line.startswith("framework_send_pipelined ") and "nats_publish_pipelined" in line
    )
    assert "(met)" in pipelined
    metrics["stub_work_us"] = 0.0
    grpc_suite.shares_of_cap(metrics)
    assert metrics["official_send_pct_of_cap"] == 90.0
