"""The client library's exceptions: one root, narrow subclasses carrying what is needed to act.

Control flow a handler raises (`RetryLater`, `Discard`) lives in `reliable.outcomes` and is not
an error. Everything here is.

`FailureKind`, what the retry policy does with a failed call, is the broker's
(`protocol.codes`, with the one table from protocol code to kind that both transports use);
`call_error` is the client's error for a kind.
"""

from __future__ import annotations

from protocol.codes import FailureKind as FailureKind  # re-exported: one enum


class ReliableError(Exception):
    """Root of every error the client library raises."""


class ConfigurationError(ReliableError):
    """An option, a name or a combination of options is invalid (raised at declaration)."""


class InvalidName(ConfigurationError):
    """A topic or group name breaks the naming rules."""

    def __init__(self, kind: str, name: str, reason: str) -> None:
        self.kind = kind
        self.name = name
        self.reason = reason
        super().__init__(f"invalid {kind} name {name!r}: {reason}")


class ClientStateError(ReliableError):
    """The client is not started, or has been shut down."""


class SendError(ReliableError):
    """Root of send failures."""


class BrokerCallError(SendError):
    """A transport call failed; `kind` tells the retry policy what to do with it."""

    def __init__(self, kind: FailureKind, message: str, *, code: str | None = None) -> None:
        self.kind = kind
        self.code = code
        super().__init__(f"{kind.value}: {message}" + (f" ({code})" if code else ""))

    @property
    def retriable(self) -> bool:
        return self.kind in (
            FailureKind.TRANSPORT,
            FailureKind.TRY_ELSEWHERE,
            FailureKind.FLOW_CONTROL,
            FailureKind.NOT_REPLICATED,
        )


class TransportError(BrokerCallError):
    """The broker could not be reached or did not answer."""

    def __init__(self, message: str) -> None:
        super().__init__(FailureKind.TRANSPORT, message)


class BadRequest(BrokerCallError):
    """The broker refused the request as malformed or invalid: retrying cannot help."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(FailureKind.BAD_REQUEST, message, code=code)


class GroupResendRefused(BadRequest):
    """The broker refused a per-group resend (`Producer.send_to_group`): not a well-formed
    one (no such original topic, a group it may not create, a delayed message, ...)."""

    def __init__(self, group: str, topic: str, reason: str, *, code: str | None = None) -> None:
        self.group = group
        self.topic = topic
        self.reason = reason
        super().__init__(f"resend of a {topic!r} message to group {group!r}: {reason}", code=code)


class GroupResendUnsupported(ConfigurationError):
    """The broker does not accept per-group resends (an Apache RocketMQ proxy, or a server
    started with `--no-group-resend`): `Producer.can_send_to_group()` says so beforehand."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        super().__init__(f"{endpoint} does not accept per-group resends")


class BrokerBusy(BrokerCallError):
    """Flow control: the broker asked the client to slow down."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(FailureKind.FLOW_CONTROL, message, code=code)


class BrokerUnavailable(BrokerCallError):
    """The broker cannot store messages now (disk full, shutting down): try another one.

    `reason` is the store's refusal (`"DISK_FULL"`, `"SERVICE_NOT_AVAILABLE"`, ...)."""

    DISK_FULL = "DISK_FULL"

    def __init__(self, message: str, *, reason: str, code: str | None = None) -> None:
        self.reason = reason
        super().__init__(FailureKind.TRY_ELSEWHERE, message, code=code)

    @property
    def disk_full(self) -> bool:
        """The broker refuses writes because its disk is above the refuse watermark."""
        return self.reason == self.DISK_FULL


def call_error(kind: FailureKind, message: str, *, code: str | None = None) -> BrokerCallError:
    """The client's error for a failed call of this kind (`protocol.codes.failure_kind`)."""
    if kind is FailureKind.FLOW_CONTROL:
        return BrokerBusy(message, code=code)
    if kind is FailureKind.BAD_REQUEST:
        return BadRequest(message, code=code)
    return BrokerCallError(kind, message, code=code)


class SendFailed(SendError):
    """Every send attempt failed; `attempts` lists (queue, error) for each."""

    def __init__(self, topic: str, attempts: list[tuple[str, BaseException]]) -> None:
        self.topic = topic
        self.attempts = attempts
        last = attempts[-1][1] if attempts else "no attempt was made"
        super().__init__(f"send to {topic!r} failed after {len(attempts)} attempt(s): {last}")

    @property
    def last_error(self) -> BaseException | None:
        """The last attempt's error (a `BrokerUnavailable` names a full disk, say)."""
        return self.attempts[-1][1] if self.attempts else None


class NoRoute(SendError):
    """The topic has no writable queue (missing topic or no permission). `transitional`:
    this producer saw the topic writable before (its master went away, a failover is under
    way), so the send waits it out within its failover patience."""

    def __init__(self, topic: str, *, transitional: bool = False) -> None:
        self.topic = topic
        self.transitional = transitional
        what = "no writable queue for the moment" if transitional else "no writable queue"
        super().__init__(f"{what} for topic {topic!r}")


class TransactionError(ReliableError):
    """A transactional send could not be completed."""


class ReceiptHandleError(ReliableError):
    """A receipt handle is unknown, stale (replaced by a newer one) or expired."""

    def __init__(self, handle: str, reason: str) -> None:
        self.handle = handle
        self.reason = reason
        super().__init__(f"receipt handle {handle!r}: {reason}")


class InvalidMessage(ReliableError, ValueError):
    """A message cannot be sent as given (empty body, bad delay, mixed batch, ...)."""
