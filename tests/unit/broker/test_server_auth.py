"""The server's access-key check (`broker.server.auth.verify`) as each official client signs.

The Python and Java clients write `Credential=<access key>`; the Go client writes a scope,
`Credential=<access key>//Rocketmq`. Both name the same key; a wrong key, secret, date or
algorithm is refused whatever the form.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from broker.server.auth import verify
from broker.server.errors import Unauthorized
from protocol.signing import ALGORITHM, authorization, sign

KEYS = {"ak": "secret"}
NOW = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
DATE = NOW.strftime("%Y%m%dT%H%M%SZ")
SKEW_S = 60


def _metadata(header: str, date: str = DATE) -> dict[str, str]:
    return {"authorization": header, "x-mq-date-time": date}


def _go_header(access_key: str, secret: str, date: str = DATE) -> str:
    return (
        f"{ALGORITHM} Credential={access_key}//Rocketmq, "
        f"SignedHeaders=x-mq-date-time, Signature={sign(secret, date)}"
    )


@pytest.mark.parametrize(
    "header",
    [authorization("ak", "secret", DATE), _go_header("ak", "secret")],
    ids=["python-java", "go"],
)
def test_each_client_s_credential_names_the_same_access_key(header: str) -> None:
    assert verify(_metadata(header), KEYS, NOW.timestamp(), SKEW_S) == "ak"


@pytest.mark.parametrize(
    ("header", "date", "why"),
    [
        (_go_header("other", "secret"), DATE, "unknown access key 'other'"),
        (_go_header("ak", "wrong"), DATE, "signature does not match"),
        (_go_header("ak", "secret", "20261129T090000Z"), "20261129T090000Z", "too far"),
        ("HMAC-MD5 Credential=ak, SignedHeaders=x-mq-date-time, Signature=0", DATE, "must use"),
    ],
    ids=["unknown-key", "wrong-secret", "stale-date", "algorithm"],
)
def test_a_wrong_key_secret_date_or_algorithm_is_refused(header: str, date: str, why: str) -> None:
    with pytest.raises(Unauthorized, match=why):
        verify(_metadata(header, date), KEYS, NOW.timestamp(), SKEW_S)
