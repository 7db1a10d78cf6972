"""The cluster file (`broker.server.cluster`): what it accepts, what it refuses and why,
and which server of a group a route names."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.server.cluster import BrokerGroup, ClusterConfig, ClusterFileError, ClusterView, State

JSON = """{"groups": [
  {"name": "broker-a", "master": "127.0.0.1:8081", "slaves": ["127.0.0.1:8082"]},
  {"name": "broker-b", "master": "127.0.0.1:8091"}
]}"""

TOML = """
[[groups]]
name = "broker-a"
master = "127.0.0.1:8081"
slaves = ["127.0.0.1:8082"]

[[groups]]
name = "broker-b"
master = "127.0.0.1:8091"
"""


def test_json_and_toml_describe_the_same_groups(tmp_path: Path) -> None:
    (tmp_path / "c.json").write_text(JSON)
    (tmp_path / "c.toml").write_text(TOML)
    expected = ClusterConfig(
        (
            BrokerGroup("broker-a", (("127.0.0.1", 8081), ("127.0.0.1", 8082))),
            BrokerGroup("broker-b", (("127.0.0.1", 8091),)),
        )
    )
    assert ClusterConfig.load(tmp_path / "c.json") == expected
    assert ClusterConfig.load(tmp_path / "c.toml") == expected


@pytest.mark.parametrize(
    ("document", "why"),
    [
        ({}, 'a list "groups"'),
        ({"groups": []}, "at least one broker group"),
        ({"groups": [{"name": "a"}]}, "no master endpoint"),
        ({"groups": [{"name": "a", "master": "127.0.0.1"}]}, "is not HOST:PORT"),
        ({"groups": [{"name": "a", "master": "h:0"}]}, "is not HOST:PORT"),
        ({"groups": [{"name": "a b", "master": "h:1"}]}, "broker name"),
        ({"groups": [{"name": "a", "master": "h:1", "slave": []}]}, "unknown keys"),
        ({"groups": [{"name": "a", "master": "h:1", "slaves": "h:2"}]}, "slaves is a list"),
        (
            {"groups": [{"name": "a", "master": "h:1"}, {"name": "a", "master": "h:2"}]},
            "named twice",
        ),
        (
            {"groups": [{"name": "a", "master": "h:1"}, {"name": "b", "master": "h:1"}]},
            "also serves 'a'",
        ),
    ],
)
def test_a_bad_cluster_file_is_refused_with_the_reason(document: object, why: str) -> None:
    with pytest.raises(ClusterFileError, match=why):
        ClusterConfig.parse(document)


def test_unreadable_or_malformed_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ClusterFileError, match="cannot read"):
        ClusterConfig.load(tmp_path / "missing.json")
    (tmp_path / "bad.toml").write_text("[[groups]\n")
    with pytest.raises(ClusterFileError, match="not valid TOML"):
        ClusterConfig.load(tmp_path / "bad.toml")


def test_the_serving_server_of_a_group_follows_the_probes() -> None:
    config = ClusterConfig.parse(
        {
            "groups": [
                {"name": "a", "master": "h:1", "slaves": ["h:2", "h:3"]},
                {"name": "b", "master": "h:4"},
            ]
        }
    )
    view = ClusterView(config, ("b", 0), lambda: True)
    a = config.groups[0]
    served = view.serving(a)  # not probed yet: the master counts as up
    assert served is not None and (served.port, served.broker_id, served.writable) == (1, 0, True)
    view._states[("h", 1)] = State.DOWN
    view._states[("h", 2)] = State.DOWN
    served = view.serving(a)
    assert served is not None and (served.port, served.broker_id, served.writable) == (3, 2, False)
    view._states[("h", 3)] = State.MASTER  # slave 2 was promoted: broker id 0, writable
    served = view.serving(a)
    assert served is not None and (served.port, served.broker_id, served.writable) == (3, 0, True)
    view._states[("h", 3)] = State.DOWN
    assert view.serving(a) is None  # nothing of the group answers: out of the routes
    with pytest.raises(ClusterFileError, match="no broker group 'c'"):
        ClusterView(config, ("c", 0), lambda: True)
    with pytest.raises(ClusterFileError, match="no broker id 1"):
        ClusterView(config, ("b", 1), lambda: True)
