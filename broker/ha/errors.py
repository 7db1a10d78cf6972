"""Replication's errors: its verdicts on a send, as errors the server answers with
(status.py maps their response codes: SLAVE_NOT_AVAILABLE -> HA_NOT_AVAILABLE,
FLUSH_SLAVE_TIMEOUT -> SLAVE_PERSISTENCE_TIMEOUT; clients retry both), and the refusals
of a promotion or a rejoin."""

from __future__ import annotations

from broker.errors import BrokerError, ResponseCode


class NotReplicated(BrokerError):
    """SYNC_MASTER: the message is stored on the master, but no slave acknowledged it."""

    def __init__(self, code: ResponseCode, reason: str) -> None:
        self.code = code
        super().__init__(f"stored on the master, not acknowledged by a slave: {reason}")


class PromotionRefused(BrokerError):
    """`admin broker promote` refused; `reason` names why, in one word:

    - `not-a-slave`: the broker is a master (or has no replication role);
    - `not-caught-up`: the slave lacks bytes its master had (as of the master's last
      frame), or never heard from its master since it started;
    - `master-alive`: the slave is still connected to a live master;
    - `ha-port`: the replication listener could not be opened.
    """

    code = ResponseCode.NO_PERMISSION

    def __init__(self, reason: str, message: str) -> None:
        self.reason = reason
        super().__init__(f"promotion refused ({reason}): {message}")


class RejoinRefused(BrokerError):
    """A store cannot rejoin its group as a slave of this master without losing data
    a slave acknowledged (or its history does not continue the master's)."""

    code = ResponseCode.NO_PERMISSION
