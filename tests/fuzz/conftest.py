"""Fuzz suite settings: seeded hypothesis profiles.

`make test` runs the "ci" profile: derandomized (the same examples every run, so a failure
reproduces), a bounded number of examples per test, the whole directory within about a minute.
`make soak` passes `--soak` and runs the "soak" profile: many more examples, still seeded by
`--seed` when given. Every test here is marked `fuzz`.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

_COMMON = dict(deadline=None, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=60, derandomize=True, **_COMMON)
settings.register_profile("soak", max_examples=5_000, **_COMMON)


def pytest_configure(config: pytest.Config) -> None:
    settings.load_profile("soak" if config.getoption("--soak") else "ci")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/fuzz/" in str(item.fspath):
            item.add_marker(pytest.mark.fuzz)
