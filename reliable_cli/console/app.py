"""The console's pages: a Flask application, rendered on the server with Jinja2.

    /                  overview: topics, groups, lag, dead letters, disk, charts
    /topics/<t>        one topic: queues, offsets, store times
    /groups/<g>        one group: settings, consumers, progress per topic and queue
    /messages          search by id, key, unique key or time range
    /trace?key=K       one message: its records and its trace (with --db: the outbox's too)
    /dlq, /dlq/<g>     dead letters per group, and their replay
    /outbox            the stub backlog by status and age (--db)
    /reconcile         the last reconciliation runs and their certificates (--db)

`create_app(settings, view, sampler, outbox)` builds it from parts the command made, so
tests can build the same application on a real broker and database. Each group of pages
is a blueprint of its own in `reliable_cli.console.pages`; this module holds what every
page shares: the session's configuration, the templates' globals, the security headers
and the error pages.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from flask import Flask, Response, render_template, request, session
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from reliable_cli.console import security
from reliable_cli.console.broker_view import BrokerView, ConsoleError, NotAvailable
from reliable_cli.console.database import OutboxView
from reliable_cli.console.pages import auth, dead_letters, messages, overview
from reliable_cli.console.pages import outbox as outbox_pages
from reliable_cli.console.sampler import Sampler
from reliable_cli.console.settings import Settings, age, iso, when

__all__ = ["Settings", "create_app", "run_forever"]

log = logging.getLogger(__name__)


def create_app(
    settings: Settings, view: BrokerView, sampler: Sampler, outbox: OutboxView | None
) -> Flask:
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=secrets.token_bytes(32),  # sessions end when the console restarts
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_NAME="reliable_console",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=security.SESSION_HOURS),
        MAX_CONTENT_LENGTH=256 * 1024,
    )
    app.jinja_env.globals.update(iso=iso, age=age, settings=settings)
    app.jinja_env.filters["iso"] = iso
    app.jinja_env.filters["when"] = when
    _share_page_globals(app, settings, has_db=outbox is not None)
    _register_error_pages(app)
    app.register_blueprint(auth.blueprint(settings))
    app.register_blueprint(overview.blueprint(settings, view, sampler))
    app.register_blueprint(messages.blueprint(settings, view))
    app.register_blueprint(dead_letters.blueprint(settings, view, sampler))
    app.register_blueprint(outbox_pages.blueprint(outbox))
    return app


def _share_page_globals(app: Flask, settings: Settings, *, has_db: bool) -> None:
    """What every page shows (the user, the CSRF token, the mode), and its headers."""

    @app.after_request
    def headers(response: Response) -> Response:
        response.headers.update(security.HEADERS)
        return response

    @app.context_processor
    def page_globals() -> dict[str, Any]:
        if "csrf" not in session:
            session["csrf"] = security.new_csrf_token()
        return {
            "csrf": session["csrf"],
            "user": auth.current_user(),
            "actions": settings.allow_actions,
            "has_db": has_db,
        }


def _register_error_pages(app: Flask) -> None:
    """Refusals, an unreachable broker and unexpected failures as pages, never a traceback."""

    def refused(exc: HTTPException) -> tuple[str, int]:
        code = exc.code or 400
        title = {403: "Refused", 404: "Not found"}.get(code, "Bad request")
        return render_template("error.html", title=title, message=exc.description or str(exc)), code

    for code in (400, 403, 404, 405, 413):
        app.register_error_handler(code, refused)

    @app.errorhandler(ConsoleError)
    def console_error(exc: ConsoleError) -> tuple[str, int]:
        status = 501 if isinstance(exc, NotAvailable) else 503
        return render_template("error.html", title="Unavailable", message=str(exc)), status

    @app.errorhandler(Exception)
    def unexpected(exc: Exception) -> ResponseReturnValue:
        if isinstance(exc, HTTPException):
            return exc
        log.exception("console: %s %s failed", request.method, request.path)
        return render_template(
            "error.html", title="Error", message=f"{type(exc).__name__}: {exc}"
        ), 500


def run_forever(
    app: Flask, host: str, port: int, threads: int = 8, ready: Callable[[int], None] | None = None
) -> None:
    """Serve with waitress (a production WSGI server: threads, no debugger)."""
    from waitress.server import create_server

    server = create_server(app, host=host, port=port, threads=threads, ident="reliable")
    bound = int(server.effective_port)
    if ready is not None:
        ready(bound)
    server.run()
