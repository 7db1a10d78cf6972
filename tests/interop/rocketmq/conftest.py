"""Apache RocketMQ 5 (name server, broker, proxy) for the interop tests, once per package.

This directory is one unit of work under pytest-xdist (`SHARED_UNITS` in tests/conftest.py):
its modules run on one worker, which starts one cluster for them all. The jars come from
Maven Central the first time (`apache_rocketmq.ensure_lib`, cached under
~/.cache/reliable/rocketmq); a machine that cannot reach it fails here, in one line.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from apache_rocketmq import RocketMQCluster, running_cluster
from tests.e2e.grpc import official
from tests.interop.rocketmq.helpers import BROKER_OPTIONS


# package-scoped: stopped once this directory's tests are done, so its JVM (about a core
# while it runs) does not go on beside the rest of the suite on its worker
@pytest.fixture(scope="package")
def rocketmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RocketMQCluster]:
    started = time.monotonic()
    with running_cluster(
        tmp_path_factory.mktemp("apache-rocketmq"), broker_options=BROKER_OPTIONS
    ) as cluster:
        rss = sum(cluster.rss_bytes().values()) // 2**20
        print(
            f"Apache RocketMQ {cluster.version} at {cluster.endpoint}: "
            f"started in {time.monotonic() - started:.1f} s, {rss} MiB resident",
            file=sys.stderr,
        )
        yield cluster


@pytest.fixture(scope="session")
def official_client_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """HOME for the official Python client, which logs under $HOME from its import on."""
    with official.client_home(tmp_path_factory.mktemp("official-client-home")) as home:
        yield home
