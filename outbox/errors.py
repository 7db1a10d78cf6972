"""The outbox's exceptions: one root, narrow subclasses carrying what is needed to act."""

from __future__ import annotations


class OutboxError(Exception):
    """Root of every error raised by the outbox package."""


class OutboxMisuse(OutboxError):
    """The outbox API was used in a way that could send a message for uncommitted data."""


class NoActiveTransaction(OutboxMisuse):
    """`publish` was called on a session or connection outside a transaction."""


class InvalidStub(OutboxError):
    """A message cannot become a stub (bad topic, too long an id, ...)."""

    def __init__(self, message_id: str, reason: str) -> None:
        self.message_id = message_id
        self.reason = reason
        super().__init__(f"message {message_id!r}: {reason}")


class DuplicateMessageId(OutboxError):
    """A stub with this message id already exists (ids must be unique per message)."""

    def __init__(self, message_id: str) -> None:
        self.message_id = message_id
        super().__init__(f"a stub with message id {message_id!r} already exists")


class UnsupportedDatabase(OutboxError):
    """The database dialect has no safe claim strategy for concurrent resend workers."""

    def __init__(self, dialect: str) -> None:
        self.dialect = dialect
        super().__init__(f"no resend claim strategy for the {dialect!r} dialect")


class NotifyFailed(OutboxError):
    """A notifier could not deliver an escalation (the stub stays due for another try)."""

    def __init__(self, notifier: str, message_id: str, cause: str) -> None:
        self.notifier = notifier
        self.message_id = message_id
        super().__init__(f"{notifier}: escalation of {message_id!r} not delivered: {cause}")


# `last_error` prefix of a stub whose send the broker refused for good (the resend worker
# escalated it at once); reconciliation reads it to say why the stub needs manual handling
REFUSED_PREFIX = "REFUSED "


def is_permanent(exc: BaseException) -> bool:
    """True when sending again cannot succeed: the broker refused the request itself (a bad
    name, an oversized or malformed message), or the message breaks the client's rules.
    Flow control, an unreachable broker, a missing route or a full disk are transient.
    A sender's own exception may say so with a `permanent = True` attribute."""
    from reliable.errors import BrokerCallError, FailureKind, InvalidMessage, InvalidName

    flag = getattr(exc, "permanent", None)
    if isinstance(flag, bool):
        return flag
    if isinstance(exc, BrokerCallError):
        return exc.kind is FailureKind.BAD_REQUEST
    # about the message itself; a client that is not started or misconfigured is not
    return isinstance(exc, InvalidMessage | InvalidName | InvalidStub)
