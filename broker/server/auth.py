"""Optional access-key authentication: the server's check of `protocol.signing`.

The header and its signature are `protocol.signing`'s. The date is `%Y%m%dT%H%M%SZ`, but
the official Python client formats its *local* time and appends `Z`; so the freshness check
only bounds the skew (27 h by default: every time zone fits). The Go client writes the
credential as a scope, `Credential=<ak>//Rocketmq`; the access key is what precedes the
first `/`, as the Apache proxy reads it.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from datetime import UTC, datetime

from broker.server.errors import Unauthorized
from protocol.signing import ALGORITHM, sign


def _fields(header: str) -> dict[str, str]:
    algorithm, _, rest = header.strip().partition(" ")
    if algorithm != ALGORITHM:
        raise Unauthorized(f"authorization must use {ALGORITHM}")
    out: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name.strip()] = value.strip()
    return out


def verify(
    metadata: Mapping[str, str], credentials: Mapping[str, str], now_s: float, max_skew_s: int
) -> str:
    """The caller's access key, or `Unauthorized`."""
    header = metadata.get("authorization")
    if not header:
        raise Unauthorized("authentication is required: no authorization header")
    fields = _fields(header)
    access_key = fields.get("Credential", "").partition("/")[0]
    secret = credentials.get(access_key)
    if secret is None:
        raise Unauthorized(f"unknown access key {access_key[:64]!r}")
    if fields.get("SignedHeaders", "").lower() != "x-mq-date-time":
        raise Unauthorized("SignedHeaders must be x-mq-date-time")
    date_time = metadata.get("x-mq-date-time", "")
    try:
        signed_at = datetime.strptime(date_time, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise Unauthorized("x-mq-date-time is missing or malformed") from None
    if abs(signed_at.timestamp() - now_s) > max_skew_s:
        raise Unauthorized("x-mq-date-time is too far from the server's clock")
    if not hmac.compare_digest(sign(secret, date_time), fields.get("Signature", "").lower()):
        raise Unauthorized("signature does not match")
    return access_key
