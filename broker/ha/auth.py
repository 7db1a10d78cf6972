"""Who may replicate: the HA link's handshake, and the refusals it logs.

With access keys configured (`--credentials-file`, the client port's keys), a master
requires every peer to prove it holds one, and proves in turn that it holds the same one;
no secret crosses the wire. The slave names an access key and sends a fresh nonce in its
hello; the master answers with a fresh nonce of its own (a challenge); the slave sends
`HMAC-SHA256(secret, "RLHA4 slave\\0" | hello | master nonce)`; the master checks it
(`hmac.compare_digest`) and answers `HMAC-SHA256(secret, "RLHA4 master\\0" | hello |
master nonce | slave proof)`, which the slave checks. The hello, its group name and both
nonces are signed, so a proof is good for this connection only, and each side's proof is
made with a label of its own, so neither can be replayed as the other's. The slave proves
first: a peer without a key learns nothing it could test guesses of the secret against.

The layout of each message is in `broker.ha.protocol`; docs/ha.md draws it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from collections.abc import Mapping

from broker.ha.protocol import NONCE

SLAVE_LABEL = b"RLHA4 slave\0"
MASTER_LABEL = b"RLHA4 master\0"


def nonce() -> bytes:
    return secrets.token_bytes(NONCE)


def slave_proof(secret: str, hello: bytes, master_nonce: bytes) -> bytes:
    return hmac.new(secret.encode(), SLAVE_LABEL + hello + master_nonce, hashlib.sha256).digest()


def master_proof(secret: str, hello: bytes, master_nonce: bytes, slave_proof_: bytes) -> bytes:
    message = MASTER_LABEL + hello + master_nonce + slave_proof_
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


def secret_for(credentials: Mapping[str, str], access_key: str) -> tuple[str, bool]:
    """(the secret to check a proof with, whether the key is known). An unknown key is
    checked against a random secret, so the peer cannot tell it from a wrong secret."""
    secret = credentials.get(access_key)
    if secret is None:
        return secrets.token_hex(32), False
    return secret, True


def pick_access_key(credentials: Mapping[str, str], chosen: str | None) -> str | None:
    """The key a slave authenticates with: `chosen` (--ha-access-key), else the first of
    its credentials file; None without credentials. ValueError: `chosen` is not in it."""
    if chosen is not None:
        if chosen not in credentials:
            raise ValueError(f"--ha-access-key {chosen!r} is not in the credentials file")
        return chosen
    return next(iter(credentials), None)


class RefusalLog:
    """Logs each refusal of a peer once per `interval_s` for the same peer host and
    reason (a peer that dials again every second is one line a minute, with the count of
    the refusals in between)."""

    def __init__(
        self,
        logger: logging.Logger,
        interval_s: float = 60.0,
        *,
        said: str = "replication: peer %s refused (%s): %s%s",
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.said = said  # the line: address, kind, why, and the count since the last
        self._lock = threading.Lock()
        self._last: dict[tuple[str, str], tuple[float, int]] = {}
        self.count = 0  # every refusal, logged or not

    def refused(self, address: str, kind: str, why: str, *, now: float | None = None) -> bool:
        """Note a refusal of the peer at `address` ("host:port"); True when logged."""
        host = address.rpartition(":")[0] or address
        at = time.monotonic() if now is None else now
        with self._lock:
            self.count += 1
            last, skipped = self._last.get((host, kind), (None, 0))
            if last is not None and at - last < self.interval_s:
                self._last[(host, kind)] = (last, skipped + 1)
                return False
            if len(self._last) > 4096:  # many peers: forget the old ones
                self._last.clear()
            self._last[(host, kind)] = (at, 0)
        more = f" ({skipped} more since the last line)" if skipped else ""
        self.logger.warning(self.said, address, kind, why, more)
        return True
