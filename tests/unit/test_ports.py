"""Ports for servers we start (`protocol.ports`), and the Apache RocketMQ cluster's start
made again on other ports when a JVM finds one taken (`apache_rocketmq.cluster`)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from apache_rocketmq import cluster as rocketmq_cluster
from apache_rocketmq.cluster import ClusterError, Ports, RocketMQCluster
from protocol import ports
from protocol.ports import FLOOR, bindable, ephemeral_range, free_port


def test_a_free_port_is_below_the_ephemeral_range_bindable_and_not_taken() -> None:
    low, high = ephemeral_range()
    assert 0 < low <= high
    taken: set[int] = set()
    picked = [free_port(taken) for _ in range(50)]
    assert len(set(picked)) == 50 and taken == set(picked)
    for port in picked:
        assert FLOOR <= port < low
        assert bindable(port)


def test_no_port_is_handed_out_twice_in_one_process() -> None:
    """Two servers picking side by side, each with its own `taken`, before either binds
    (the bench starts two Apache RocketMQ clusters at once)."""
    first = {free_port(set()) for _ in range(200)}
    second = {free_port(set()) for _ in range(200)}
    assert len(first) == 200 and len(second) == 200
    assert not first & second


_HOLDER = """
import sys
from protocol.ports import free_port
print(" ".join(str(free_port()) for _ in range(int(sys.argv[1]))), flush=True)
sys.stdin.read()  # holds its picks until told to exit
"""


def test_two_processes_picking_at_once_never_get_one_port() -> None:
    """The workers of a parallel suite pick side by side: 400 picks each from about 12,000
    ports would share about a dozen without the machine-wide reservation."""
    root = Path(__file__).resolve().parents[2]
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, "400"],
        cwd=root,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        theirs = {int(p) for p in holder.stdout.readline().split()}
        assert len(theirs) == 400
        ours = {free_port() for _ in range(400)}
        assert not ours & theirs
        port = min(theirs)
        assert not ports._reserve(port)  # held by the other process
    finally:
        holder.communicate("", timeout=30)
    assert ports._reserve(port)  # its owner exited: the kernel let the lock go


def test_a_port_someone_listens_on_is_not_bindable_nor_picked() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not bindable(port)  # on 127.0.0.1 only: 0.0.0.0 is refused all the same


def _started_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logs: list[str], tried: list[Ports]
) -> None:
    """RocketMQCluster.start with JVM launches that fail while `logs` has lines (each
    written as the proxy's output), then succeed; `tried` gets the ports of each attempt."""

    def launch(self: RocketMQCluster, *args: object) -> None:
        tried.append(self.ports)
        self._children["proxy"] = None  # type: ignore[assignment]
        if logs:
            (self.directory / "logs" / "proxy.out").write_text(logs.pop(0))
            raise ClusterError("proxy exited with 1: ...")

    monkeypatch.setattr(rocketmq_cluster, "ensure_lib", lambda version: tmp_path / "lib")
    monkeypatch.setattr(rocketmq_cluster, "_java", lambda: "java")
    monkeypatch.setattr(RocketMQCluster, "_launch", launch)
    RocketMQCluster.start(tmp_path / "cluster", version="5.3.1")


def test_a_start_that_found_a_port_taken_is_made_again_on_other_ports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = "java.net.BindException: Address already in use\n"
    tried: list[Ports] = []
    _started_on(tmp_path, monkeypatch, [taken, taken], tried)
    assert len(tried) == 3  # two failures, then started
    assert len({p.grpc for p in tried}) == 3
    assert (tmp_path / "cluster" / "cluster.json").exists()


def test_other_failures_and_a_third_taken_port_are_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tried: list[Ports] = []
    with pytest.raises(ClusterError):
        _started_on(tmp_path / "a", monkeypatch, ["java.lang.OutOfMemoryError\n"], tried)
    assert len(tried) == 1  # not a port: not tried again
    tried.clear()
    taken = "java.net.BindException: Address already in use\n"
    with pytest.raises(ClusterError):
        _started_on(tmp_path / "b", monkeypatch, [taken] * 3, tried)
    assert len(tried) == 3
