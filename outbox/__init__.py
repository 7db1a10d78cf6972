"""Transactional outbox: message stubs, consumption log, resend worker, reconciliation."""

from outbox.claim import ClaimStrategy
from outbox.errors import (
    DuplicateMessageId,
    InvalidStub,
    NoActiveTransaction,
    NotifyFailed,
    OutboxError,
    OutboxMisuse,
    UnsupportedDatabase,
)
from outbox.latency import ExpectedLatency
from outbox.models import ConfirmationOutcome, OutboxTables, StubStatus
from outbox.notify import Escalation, LogNotifier, Notifier, SmtpNotifier, WebhookNotifier
from outbox.ports import (
    PROPERTY_RETRY_TOPIC,
    Clock,
    GroupSender,
    OffsetSource,
    QueueBounds,
    Sender,
    retry_topic,
    utcnow,
)
from outbox.publish import Outbox, OutboxConfig, OutboxTransaction
from outbox.registry import InvalidGroup, declare_groups, expected_groups
from outbox.schema import SchemaMismatch, SchemaReport, TablesMissing, ensure_schema, require_tables
from outbox.stub_admin import ActionResult, StubNotFound, StubNotOpen, requeue_stub, void_stub
from outbox.stubs import body_digest
from outbox.worker import Metrics, ResendPolicy, ResendWorker

__all__ = [  # noqa: RUF022 - grouped by concept, as in reliable/__init__
    # tables
    "ConfirmationOutcome",
    "OutboxTables",
    "StubStatus",
    "declare_groups",
    "expected_groups",
    "ensure_schema",
    "require_tables",
    "SchemaReport",
    # publishing
    "Outbox",
    "OutboxConfig",
    "OutboxTransaction",
    "body_digest",
    # contracts
    "PROPERTY_RETRY_TOPIC",
    "Clock",
    "GroupSender",
    "OffsetSource",
    "QueueBounds",
    "Sender",
    "retry_topic",
    "utcnow",
    # resend worker
    "ClaimStrategy",
    "Escalation",
    "LogNotifier",
    "Metrics",
    "Notifier",
    "ResendPolicy",
    "ResendWorker",
    "ExpectedLatency",
    "SmtpNotifier",
    "WebhookNotifier",
    # operator actions (audited)
    "ActionResult",
    "requeue_stub",
    "void_stub",
    # errors
    "DuplicateMessageId",
    "InvalidGroup",
    "InvalidStub",
    "NoActiveTransaction",
    "NotifyFailed",
    "OutboxError",
    "OutboxMisuse",
    "SchemaMismatch",
    "StubNotFound",
    "StubNotOpen",
    "TablesMissing",
    "UnsupportedDatabase",
]
