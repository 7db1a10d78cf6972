"""The admin service's wire: `reliable.admin.v1.Admin`, unary calls with JSON bodies.

A request is a JSON object of the method's parameters; a reply is `{"ok": true, "result":
...}` or `{"ok": false, "code": <protocol code name>, "message": ..., "details"?: {...},
"reason"?: ...}`. The server (`broker.server.admin`, which lists the methods) and the client
(`reliable.admin`) both encode and decode with these functions; no generated stubs.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NotRequired, TypedDict

SERVICE = "reliable.admin.v1.Admin"

Params = Mapping[str, object]
"""A request's parameters as decoded: each is checked for its type where it is read
(`broker.admin.params`)."""


class Reply(TypedDict):
    """A reply: `ok` and the method's `result`, or `ok` false with the refusal."""

    ok: bool
    result: NotRequired[object]
    code: NotRequired[str]
    message: NotRequired[str]
    details: NotRequired[dict[str, object]]
    reason: NotRequired[str]


def method_path(method: str) -> str:
    """The gRPC path of one of the service's methods."""
    return f"/{SERVICE}/{method}"


def encode(value: Mapping[str, object]) -> bytes:
    """A request or a reply as the bytes on the wire."""
    return json.dumps(value, sort_keys=True).encode()


def decode(raw: bytes) -> dict[str, Any] | None:
    """The JSON object in `raw`, or None when `raw` is not one."""
    try:
        value = json.loads(raw.decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None
