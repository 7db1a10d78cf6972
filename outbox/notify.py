"""Escalation of exhausted stubs to people: a small `Notifier` contract and three notifiers.

The resend worker calls `notify` once per exhausted stub (it records `escalated_at` right
after a successful call; a notifier that raises leaves the stub due for another try, so an
escalation is never silently dropped).
"""

from __future__ import annotations

import json
import logging
import smtplib
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from email.message import EmailMessage
from typing import Protocol, runtime_checkable

from outbox.errors import NotifyFailed

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Escalation:
    """A stub that reached `max_sends` without every expected group confirming it, or whose
    send the broker refused for good (`refused`)."""

    message_id: str
    topic: str
    send_count: int
    max_sends: int
    missing_groups: tuple[str, ...]
    created_at: datetime
    last_error: str | None
    # set when the broker refused the message itself (no resend can succeed)
    refused: bool = False

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["missing_groups"] = list(self.missing_groups)
        data["created_at"] = self.created_at.isoformat()
        return data

    def summary(self) -> str:
        groups = ", ".join(self.missing_groups) or "any group"
        if self.refused:
            return (
                f"message {self.message_id} on {self.topic} can never be sent (refused: "
                f"{self.last_error}); manual handling needed"
            )
        return (
            f"message {self.message_id} on {self.topic} unconfirmed by {groups} after "
            f"{self.send_count}/{self.max_sends} sends; manual handling needed"
        )


@runtime_checkable
class Notifier(Protocol):
    """Delivers an escalation to people; raises `NotifyFailed` when it could not."""

    def notify(self, escalation: Escalation) -> None: ...


class LogNotifier:
    """Writes the escalation to a logger at ERROR level."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self.logger = logger or logging.getLogger("reliable.escalation")

    def notify(self, escalation: Escalation) -> None:
        self.logger.error("%s", escalation.summary(), extra={"escalation": escalation.as_dict()})


class WebhookNotifier:
    """POSTs the escalation as JSON to a URL; any non-2xx answer is a failure."""

    def __init__(
        self, url: str, *, timeout: float = 10.0, headers: dict[str, str] | None = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"webhook url must be http(s): {url!r}")
        self.url = url
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", **(headers or {})}

    def notify(self, escalation: Escalation) -> None:
        body = json.dumps({"event": "reliable.escalation", **escalation.as_dict()}).encode()
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                status = response.status
        except (urllib.error.URLError, OSError) as exc:
            raise NotifyFailed("webhook", escalation.message_id, str(exc)) from exc
        if not 200 <= status < 300:
            raise NotifyFailed("webhook", escalation.message_id, f"HTTP {status}")


class SmtpNotifier:
    """Sends the escalation by e-mail over SMTP (optionally STARTTLS and login)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        sender: str,
        recipients: Sequence[str],
        starttls: bool = False,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        if not recipients:
            raise ValueError("SmtpNotifier needs at least one recipient")
        self.host, self.port = host, port
        self.sender, self.recipients = sender, list(recipients)
        self.starttls, self.username, self.password = starttls, username, password
        self.timeout = timeout

    def notify(self, escalation: Escalation) -> None:
        mail = EmailMessage()
        mail["From"] = self.sender
        mail["To"] = ", ".join(self.recipients)
        mail["Subject"] = f"[reliable] message {escalation.message_id} needs manual handling"
        mail.set_content(escalation.summary() + "\n\n" + json.dumps(escalation.as_dict(), indent=2))
        try:
            with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
                if self.starttls:
                    smtp.starttls()
                if self.username:
                    smtp.login(self.username, self.password or "")
                smtp.send_message(mail)
        except (smtplib.SMTPException, OSError) as exc:
            raise NotifyFailed("smtp", escalation.message_id, str(exc)) from exc
