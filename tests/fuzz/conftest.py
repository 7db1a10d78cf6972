"""Fuzz suite settings: seeded hypothesis profiles.

`make test` runs the "ci" profile: derandomized (the same examples every run, so a failure
reproduces), a bounded number of examples per test, the whole directory within about a minute.
`make soak` passes `--soak` and runs the "soak" profile: many more examples (5,000 per test;
500 per RPC test (test_rpc_fuzz.py), each of which is a round trip to a real server and can
long-poll: 34 of them at 5,000 would take hours), seeded by `--seed` when given (else at
random; a failure prints the seed and a blob to reproduce it). `make soak` also lifts the
300 s per-test timeout. Every test here is marked `fuzz`.
"""

from __future__ import annotations

import hypothesis.core
import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("soak", max_examples=5_000, **_COMMON)


def pytest_configure(config: pytest.Config) -> None:
    soak = bool(config.getoption("--soak"))
    settings.load_profile("soak" if soak else "ci")
    seed = config.getoption("--seed")
    if soak and seed is not None and config.getoption("--hypothesis-seed") is None:
        hypothesis.core.global_force_seed = int(seed)  # what --hypothesis-seed sets


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/fuzz/" in str(item.fspath):
            item.add_marker(pytest.mark.fuzz)
