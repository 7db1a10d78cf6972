"""Who may look, and who may act: the console's login, its CSRF tokens, its headers.

Two ways to prove who you are, chosen when the console starts:

    password      `--password-file F`: the password in F (first line); any user name
    broker key    otherwise: an access key and secret key that the broker itself accepts
                  (the console asks the broker with them once, at login)

A browser logs in through a form and then holds a session cookie (signed, HttpOnly,
SameSite=Strict, 12 hours); a script may send HTTP basic auth with the same credentials,
for reading only. Every POST carries the session's CSRF token (a form field), compared in
constant time, and must come from the console's own origin when the browser says where
it comes from. Actions need both a logged-in session and `--allow-actions`.
"""

from __future__ import annotations

import base64
import hmac
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from reliable_cli.console.broker_view import ConsoleError

SESSION_HOURS = 12
FAILED_LOGIN_DELAY_S = 0.5  # every failed login costs this much: guessing is slow

# sent with every answer: no framing, no foreign scripts or styles, no sniffing, no caching
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'none'; style-src 'self'; "
        "img-src 'self' data:; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class AuthSetupError(ConsoleError):
    """The console was started without a usable way to log in."""


@dataclass(frozen=True)
class Authenticator:
    """Checks a user name and password: against a configured password, or the broker."""

    mode: str  # "password" | "broker-key" | "none"
    password: str | None = None
    broker_check: Callable[[str, str], bool] | None = None

    def check(self, user: str, password: str) -> bool:
        if self.mode == "none":
            return True
        if self.mode == "password":
            assert self.password is not None
            ok = hmac.compare_digest(password.encode(), self.password.encode())
        else:
            assert self.broker_check is not None
            ok = bool(user) and bool(password) and self.broker_check(user, password)
        if not ok:
            time.sleep(FAILED_LOGIN_DELAY_S)
        return ok

    def check_basic(self, header: str | None) -> str | None:
        """The user of a valid `Authorization: Basic ...` header, else None."""
        if not header or not header.startswith("Basic "):
            return None
        try:
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return None
        return (user or "basic") if self.check(user, password) else None


def read_password(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuthSetupError(f"--password-file {path}: {exc.strerror}") from None
    password = text.splitlines()[0].strip() if text.strip() else ""
    if len(password) < 8:
        raise AuthSetupError(
            f"--password-file {path}: the password must have at least 8 "
            "characters on its first line"
        )
    return password


def new_csrf_token() -> str:
    return secrets.token_urlsafe(32)


def csrf_ok(session: Mapping[str, object], sent: str | None) -> bool:
    expected = session.get("csrf")
    return bool(expected) and bool(sent) and hmac.compare_digest(str(expected), str(sent))


def same_origin(origin: str | None, referer: str | None, host_url: str) -> bool:
    """False when the browser says the request comes from another site."""
    base = host_url.rstrip("/")
    if origin and origin != "null":
        return origin.rstrip("/") == base
    if referer:
        return referer == base or referer.startswith(base + "/")
    return True  # neither header (a script): the CSRF token alone decides
