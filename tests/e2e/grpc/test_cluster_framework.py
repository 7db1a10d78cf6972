"""The framework's grpc transport against two broker groups (docs/ha.md, Broker groups):
the scenarios of `test_framework_transport` that take a started transport, unchanged, with
a transport whose access point names both masters. Its producer sends to both groups, its
consumers receive from each in turn and acknowledge where each message came from."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import reliable
from reliable import Transport
from reliable.admin import AdminClient
from tests.e2e.grpc.cluster_process import Cluster
from tests.e2e.grpc.conftest import FAST
from tests.e2e.grpc.test_framework_transport import (
    test_handler_decorators_with_retry_and_dead_letter,
    test_push_consumer_handler_with_retries,
    test_recall_cancels_a_delayed_message,
    test_send_and_receive_with_invisible_time,
)

SCENARIOS = [
    test_send_and_receive_with_invisible_time,
    test_push_consumer_handler_with_retries,
    test_handler_decorators_with_retry_and_dead_letter,
    test_recall_cancels_a_delayed_message,
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, client_home: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path_factory.mktemp("cluster"), client_home, *FAST).start()
    yield made
    # both groups stored and delivered messages of the scenarios
    for group in made.groups:
        admin = AdminClient(group.master.endpoint)
        try:
            assert admin.ha_status()["max_offset"] > 20_000, group.name
        finally:
            admin.close()
    codes = made.terminate()
    assert codes == [0] * len(codes), "".join(o for p in made.processes for o in p.output)


@pytest.fixture
def transport(cluster: Cluster) -> Iterator[Transport]:
    t = reliable.connect("grpc", endpoint=cluster.endpoint)
    t.start()
    yield t
    t.close()


def test_the_scenarios_are_the_transport_ones() -> None:
    import inspect

    from tests.e2e.grpc import test_framework_transport as module

    taking_a_transport = {
        name
        for name, fn in vars(module).items()
        if name.startswith("test_") and list(inspect.signature(fn).parameters) == ["transport"]
    }
    assert taking_a_transport == {fn.__name__ for fn in SCENARIOS}
