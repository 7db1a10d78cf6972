"""Replication's verdicts on a send, as errors the server answers with (status.py maps
their response codes: SLAVE_NOT_AVAILABLE -> HA_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT ->
SLAVE_PERSISTENCE_TIMEOUT; clients retry both)."""

from __future__ import annotations

from broker.errors import BrokerError, ResponseCode


class NotReplicated(BrokerError):
    """SYNC_MASTER: the message is stored on the master, but no slave acknowledged it."""

    def __init__(self, code: ResponseCode, reason: str) -> None:
        self.code = code
        super().__init__(f"stored on the master, not acknowledged by a slave: {reason}")
