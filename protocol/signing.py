"""Access-key signing of a call: `MQv2-HMAC-SHA1`, as RocketMQ 5 clients sign calls.

Header: `authorization: MQv2-HMAC-SHA1 Credential=<ak>, SignedHeaders=x-mq-date-time,
Signature=<hex HMAC-SHA1(secret, value of x-mq-date-time)>`. The date is
`%Y%m%dT%H%M%SZ`. The clients (`reliable.transport`, `reliable.admin`) sign with these
functions and the server (`broker.server.auth`) checks with them.
"""

from __future__ import annotations

import hashlib
import hmac

ALGORITHM = "MQv2-HMAC-SHA1"
DATE_HEADER = "x-mq-date-time"
DATE_FORMAT = "%Y%m%dT%H%M%SZ"


def sign(secret: str, date_time: str) -> str:
    """The signature of `date_time` (the value of `x-mq-date-time`) under `secret`."""
    return hmac.new(secret.encode(), date_time.encode(), hashlib.sha1).hexdigest()


def authorization(access_key: str, secret: str, date_time: str) -> str:
    """The `authorization` header's value for a call sent at `date_time`."""
    return (
        f"{ALGORITHM} Credential={access_key}, "
        f"SignedHeaders={DATE_HEADER}, Signature={sign(secret, date_time)}"
    )
