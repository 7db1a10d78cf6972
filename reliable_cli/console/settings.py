"""How the console was started, and the formats its pages share (times, ages)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from reliable_cli.console import security


@dataclass(frozen=True)
class Settings:
    """How the console was started."""

    endpoint: str
    auth: security.Authenticator
    allow_actions: bool = False
    sample_interval_s: float = 5.0
    db_url: str | None = None
    table_prefix: str = "reliable_"
    schema: str | None = None


def iso(ms: int | None) -> str:
    """Epoch milliseconds as a UTC time to the second."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def when(value: object) -> str:
    """A database timestamp to the second (the outbox writes naive UTC)."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def age(value: datetime | None, now: datetime) -> str:
    """How long ago, in the largest unit that keeps it readable."""
    if value is None:
        return "-"
    seconds = max(0, int((now - value).total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def parse_time(text: str) -> int | None:
    """A datetime-local field (UTC) as epoch milliseconds."""
    text = text.strip()
    if not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return int(datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp() * 1000)
        except ValueError:
            continue
    raise ValueError(f"{text!r} is not a time (YYYY-MM-DDTHH:MM, UTC)")
