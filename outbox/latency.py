"""How long a consumer group may take to confirm a message: the rule for copies whose queue
is unknown.

A send over gRPC does not say which queue the server stored the message in (the receipt's
`queue_id` is -1), so no committed offset can prove that a group passed that copy or that
it is still ahead of the group. For such a copy the resend worker and the reconciliation
job use one and the same rule: a group that has neither confirmed the message nor holds a
consumption-log row for it once the stub is older than the group's expected latency has
lost it (resend due; the certificate counts it unaccounted).

    ExpectedLatency(timedelta(minutes=5), {"billing": timedelta(hours=1)})

On the command line (`reliable worker resend`, `reliable reconcile`): `--expected-latency
SECONDS` (the default for every group) and `--group-latency GROUP=SECONDS` (repeatable).
Give both commands the same values, or they disagree about what is lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

DEFAULT_EXPECTED_LATENCY = timedelta(minutes=5)


@dataclass(frozen=True)
class ExpectedLatency:
    """The time a group may take to confirm a message (default, and per group)."""

    default: timedelta = DEFAULT_EXPECTED_LATENCY
    groups: Mapping[str, timedelta] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, value in (("default", self.default), *self.groups.items()):
            if value < timedelta(0):
                raise ValueError(f"expected latency of {name} cannot be negative: {value}")

    def for_group(self, group: str) -> timedelta:
        """The latency of `group` ("" or "*": a stub without declared groups: the default)."""
        return self.groups.get(group, self.default)

    @classmethod
    def parse(cls, default_s: float, specs: Iterable[str] = ()) -> ExpectedLatency:
        """From `--expected-latency SECONDS` and `--group-latency GROUP=SECONDS` values;
        ValueError names the bad one."""
        groups: dict[str, timedelta] = {}
        for spec in specs:
            group, sep, seconds = spec.partition("=")
            group = group.strip()
            try:
                value = float(seconds)
            except ValueError:
                value = -1.0
            if not sep or not group or value < 0:
                raise ValueError(f"expected GROUP=SECONDS (seconds >= 0), got {spec!r}")
            groups[group] = timedelta(seconds=value)
        if default_s < 0:
            raise ValueError(f"--expected-latency cannot be negative: {default_s}")
        return cls(timedelta(seconds=default_s), groups)
