"""The official Java and Go clients observe the same on our server as on Apache RocketMQ,
and the same through our gateway as on our server.

tests/interop/differential.py runs the differential scenarios of the Java and the Go program
against a `reliable broker start` process and against the session's Apache RocketMQ cluster,
both clients on both servers side by side, and compares what each client observed on the
two, key by key: every difference must be named in `DELIBERATE` with its reason, and the
table in docs/interop.md must list every observation this run makes
(`python -m tests.interop.differential --write-docs` rewrites it).
"""

from __future__ import annotations

from typing import Any

import pytest

from apache_rocketmq import RocketMQCluster
from tests.interop import differential

# both servers run in the first test's fixtures, side by side (about a minute alone)
pytestmark = [pytest.mark.interop, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory: pytest.TempPathFactory, rocketmq: RocketMQCluster) -> dict[str, Any]:
    # the session's cluster: each client's scenarios have their own topics and groups
    return differential.observe_both(tmp_path_factory.mktemp("differential"), rocketmq)


@pytest.fixture(scope="module")
def rows(snapshot: dict[str, Any]) -> list[differential.Row]:
    return differential.compare(snapshot)


@pytest.mark.parametrize("client", differential.CLIENTS)
def test_every_scenario_reported_on_both(snapshot: dict[str, Any], client: str) -> None:
    for side in ("ours", "apache"):
        assert sorted(snapshot[client][side]) == sorted(differential.SCENARIOS), side
    assert snapshot[client]["client_version"]


def test_both_clients_observe_the_same_things(snapshot: dict[str, Any]) -> None:
    """The Go program reports under the Java program's keys, so the two compare too."""
    for scenario in differential.SCENARIOS:
        java = snapshot["java"]["ours"][scenario]["observed"]
        go = snapshot["go"]["ours"][scenario]["observed"]
        assert sorted(go) == sorted(java), scenario


@pytest.mark.parametrize("client", differential.CLIENTS)
def test_the_gateway_is_observed_exactly_as_our_server(
    snapshot: dict[str, Any], client: str
) -> None:
    """Through the gateway (docs/gateway.md) every scenario is observed as on our server's
    own gRPC port: no difference at all, deliberate or not."""
    ours, fronted = snapshot[client]["ours"], snapshot[client]["gateway"]
    assert sorted(fronted) == sorted(differential.SCENARIOS)
    rows = differential.compare_client(client, ours, fronted)
    differs = [
        (r.scenario, r.observation, r.ours, r.apache)
        for r in rows
        if (r.scenario, r.observation) not in TIMED and _same_id(r.ours) != _same_id(r.apache)
    ]
    assert differs == []  # (scenario, observation, on our server, through the gateway)


# observations of how long the server took, in buckets a loaded machine can move between
# two runs of the same server (run side by side with Apache RocketMQ and four programs)
TIMED = {("retry", "delays"), ("invisible", "second_within_s")}


def _same_id(observed: Any) -> Any:
    """The dead-letter copy's origin message id is the original's (random) id: any."""
    if isinstance(observed, dict) and "DLQ_ORIGIN_MESSAGE_ID" in observed.get("properties", {}):
        return {**observed, "properties": {**observed["properties"], "DLQ_ORIGIN_MESSAGE_ID": "*"}}
    return observed


def test_no_difference_that_is_not_deliberate(rows: list[differential.Row]) -> None:
    differs = [r for r in rows if r.verdict == "DIFFERS"]
    assert differs == [], differential.render(differs)


def test_every_deliberate_difference_is_still_named(rows: list[differential.Row]) -> None:
    """A deliberate difference names an observation the scenarios still make."""
    observed = {(r.scenario, r.observation) for r in rows}
    assert set(differential.DELIBERATE) <= observed


def test_the_docs_table_has_every_observation(rows: list[differential.Row]) -> None:
    """Row by row (values may move within a timing bucket between runs)."""
    table = differential.docs_table()
    for r in rows:
        row = f"| {differential.CLIENT_NAMES[r.client]} | {r.scenario} | {r.observation} |"
        assert row in table, (
            "docs/interop.md is stale: python -m tests.interop.differential --write-docs"
        )
