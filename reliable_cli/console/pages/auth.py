"""Who may see a page and who may act: login, logout, and the checks on every request."""

from __future__ import annotations

from urllib.parse import urlsplit

from flask import Blueprint, Response, abort, redirect, render_template, request, session, url_for
from flask.typing import ResponseReturnValue

from reliable_cli.console import security
from reliable_cli.console.settings import Settings


def current_user() -> str | None:
    """The logged-in user, or the one a GET authenticated with Basic credentials."""
    return session.get("user") or request.environ.get("console.user")


def operator() -> str:
    """Who an action is recorded as, in the broker's audit."""
    return f"console:{current_user() or 'unknown'}"


def require_actions(settings: Settings) -> None:
    """Refuse unless the console was started to act and the user has a session."""
    if not settings.allow_actions:
        abort(
            403,
            "this console is read-only: start it with --allow-actions to replay or reconsume",
        )
    if not session.get("user"):
        abort(403, "actions need a logged-in session")


def _safe_target(target: str) -> str:
    if (
        not target.startswith("/")
        or target.startswith(("//", "/\\"))
        or "\\" in target
        or urlsplit(target).netloc
    ):
        return "/"  # never an open redirect (browsers read "/\\host" as "//host")
    return target


def blueprint(settings: Settings) -> Blueprint:
    pages = Blueprint("auth", __name__)

    @pages.before_app_request
    def authenticate() -> Response | None:
        if request.endpoint in ("auth.login", "static"):
            return None
        if session.get("user"):
            return None
        if request.method == "GET":
            user = settings.auth.check_basic(request.headers.get("Authorization"))
            if user is not None:
                request.environ["console.user"] = user
                return None
        if settings.auth.mode == "none":
            session["user"] = "local"
            return None
        if request.headers.get("Authorization", "").startswith("Basic "):
            return Response(
                "wrong credentials\n", 401, {"WWW-Authenticate": 'Basic realm="reliable console"'}
            )
        return redirect(url_for("auth.login", next=request.full_path))  # type: ignore[return-value]

    @pages.before_app_request
    def check_post() -> None:
        if request.method != "POST":
            return
        if not security.same_origin(
            request.headers.get("Origin"), request.headers.get("Referer"), request.host_url
        ):
            abort(403, "the request came from another site")
        if "csrf" not in session:
            abort(403, "no session: log in again")
        if not security.csrf_ok(session, request.form.get("csrf")):
            abort(403, "the form's CSRF token is missing or stale: reload the page")

    @pages.route("/login", methods=["GET", "POST"])
    def login() -> ResponseReturnValue:
        error = None
        target = _safe_target(request.args.get("next") or "/")
        if request.method == "POST":
            user = request.form.get("user", "")
            if settings.auth.check(user, request.form.get("password", "")):
                session.clear()
                session.permanent = True
                session["user"] = user or "operator"
                session["csrf"] = security.new_csrf_token()
                return redirect(target)
            error = "wrong credentials"
        return render_template(
            "login.html", title="Log in", error=error, target=target, mode=settings.auth.mode
        ), (401 if error else 200)

    @pages.route("/logout", methods=["POST"])
    def logout() -> ResponseReturnValue:
        session.clear()
        return redirect(url_for("auth.login"))

    return pages
