"""One JSON object per log line, for log shippers (`--log-format json`).

    import logging
    from reliable.logs import JsonFormatter
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(handlers=[handler], level=logging.INFO)

Each line holds `time` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`, the
fields passed with `extra=` (anything JSON cannot encode is written as its `str`), and, only
when the record carries one, `exception` (the formatted traceback) or `stack`.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

# attributes every LogRecord has: anything else on a record came from `extra=`
_STANDARD = frozenset(logging.LogRecord("x", logging.INFO, "x", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, default=str, ensure_ascii=False)


def log_formatter(log_format: str) -> logging.Formatter:
    """The formatter for a `--log-format` value: "text" or "json"."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "text":
        return logging.Formatter(TEXT_FORMAT)
    raise ValueError(f"unknown log format {log_format!r}: expected one of {LOG_FORMATS}")


__all__ = ["LOG_FORMATS", "TEXT_FORMAT", "JsonFormatter", "log_formatter"]
