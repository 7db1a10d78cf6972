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
tests can build the same application on a real broker and database.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from flask import (
    Flask,
    Response,
    abort,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from werkzeug.exceptions import HTTPException

from reliable.admin import AdminCallError
from reliable_cli.console import charts, security
from reliable_cli.console.broker_view import (
    BrokerView,
    ConsoleError,
    NotAvailable,
    is_user_topic,
)
from reliable_cli.console.database import OutboxView
from reliable_cli.console.replay import ReplayJobs
from reliable_cli.console.sampler import (
    Sampler,
    consumed_rates,
    lag_series,
    produced_rates,
)

log = logging.getLogger(__name__)

MAX_REPLAY_RATE = 1000  # messages per second a replay may be asked for
MAX_REPLAY_IDS = 1000  # the broker's limit of one replay call
DEFAULT_REPLAY_RATE = 10


@dataclass(frozen=True)
class Settings:
    """How the console was started."""

    endpoint: str
    auth: security.Authenticator
    allow_actions: bool = False
    sample_interval_s: float = 5.0
    db_url: str | None = None
    table_prefix: str = "reliable_"
    schema: str | None = None


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _when(value: Any) -> str:
    """A database timestamp to the second (the outbox writes naive UTC)."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def _age(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "-"
    seconds = max(0, int((now - value).total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def _parse_time(text: str) -> int | None:
    """A datetime-local field (UTC) as epoch milliseconds."""
    text = text.strip()
    if not text:
        return None
    for fmt in ("%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"):
        try:
            return int(datetime.strptime(text, fmt).replace(tzinfo=UTC).timestamp() * 1000)
        except ValueError:
            continue
    raise ValueError(f"{text!r} is not a time (YYYY-MM-DDTHH:MM, UTC)")


def create_app(
    settings: Settings, view: BrokerView, sampler: Sampler, outbox: OutboxView | None
) -> Flask:
    app = Flask(__name__)
    jobs = ReplayJobs(view)
    app.config.update(
        SECRET_KEY=secrets.token_bytes(32),  # sessions end when the console restarts
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        SESSION_COOKIE_NAME="reliable_console",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=security.SESSION_HOURS),
        MAX_CONTENT_LENGTH=256 * 1024,
    )
    app.jinja_env.globals.update(iso=_iso, age=_age, settings=settings)
    app.jinja_env.filters["iso"] = _iso
    app.jinja_env.filters["when"] = _when

    # ------------------------------------------------------------------ security
    @app.before_request
    def authenticate() -> Response | None:
        if request.endpoint in ("login", "static"):
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
        return redirect(url_for("login", next=request.full_path))  # type: ignore[return-value]

    @app.before_request
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
            "user": current_user(),
            "actions": settings.allow_actions,
            "has_db": outbox is not None,
        }

    def current_user() -> str | None:
        return session.get("user") or request.environ.get("console.user")

    def require_actions() -> None:
        if not settings.allow_actions:
            abort(
                403,
                "this console is read-only: start it with --allow-actions to replay or reconsume",
            )
        if not session.get("user"):
            abort(403, "actions need a logged-in session")

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
    def unexpected(exc: Exception) -> Any:
        if isinstance(exc, HTTPException):
            return exc
        log.exception("console: %s %s failed", request.method, request.path)
        return render_template(
            "error.html", title="Error", message=f"{type(exc).__name__}: {exc}"
        ), 500

    @app.route("/login", methods=["GET", "POST"])
    def login() -> Any:
        error = None
        target = request.args.get("next") or "/"
        if (
            not target.startswith("/")
            or target.startswith(("//", "/\\"))
            or "\\" in target
            or urlsplit(target).netloc
        ):
            target = "/"  # never an open redirect (browsers read "/\\host" as "//host")
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

    @app.route("/logout", methods=["POST"])
    def logout() -> Any:
        session.clear()
        return redirect(url_for("login"))

    # ------------------------------------------------------------------ overview
    @app.route("/")
    def overview() -> str:
        latest = sampler.latest()
        samples = sampler.samples()
        rates = produced_rates(samples[-2:]) if len(samples) >= 2 else {}
        consumed = consumed_rates(samples[-2:]) if len(samples) >= 2 else {}
        topics = [] if latest.error else view.topics()
        return render_template(
            "overview.html",
            title="Overview",
            sample=latest,
            topics=topics,
            rates={k: v[-1][1] for k, v in rates.items()},
            consumed={k: v[-1][1] for k, v in consumed.items()},
            lag_chart=charts.line_chart(
                lag_series(samples), title="Consumer lag", unit="messages", chart_id="chart-lag"
            ),
            produced_chart=charts.line_chart(
                produced_rates(samples),
                title="Produced per topic",
                unit="msg/s",
                chart_id="chart-produced",
            ),
            consumed_chart=charts.line_chart(
                consumed_rates(samples),
                title="Consumed per group",
                unit="msg/s",
                chart_id="chart-consumed",
            ),
            refresh=max(2, int(settings.sample_interval_s)),
        )

    @app.route("/topics/<path:name>")
    def topic(name: str) -> str:
        info = view.topic(name)
        try:
            status: dict[str, Any] | None = view.topic_status(name)
        except NotAvailable:
            status = None
        samples = sampler.samples()
        series = {k: v for k, v in produced_rates(samples).items() if k == name}
        return render_template(
            "topic.html",
            title=f"Topic {name}",
            name=name,
            info=info,
            status=status,
            chart=charts.line_chart(
                series, title=f"Produced to {name}", unit="msg/s", chart_id="chart-topic"
            ),
        )

    @app.route("/groups/<path:name>")
    def group(name: str) -> str:
        names = [t["name"] for t in view.topics()]
        progress = view.group_progress(name, [n for n in names if is_user_topic(n)])
        lag = view.group_lag(name, [n for n in names if is_user_topic(n)])
        if not progress.get("settings"):
            info = view.call("GetGroup", name=name)
            progress["settings"] = {k: v for k, v in info.items() if k != "consumers"}
        samples = sampler.samples()
        return render_template(
            "group.html",
            title=f"Group {name}",
            name=name,
            progress=progress,
            lag=lag,
            lag_chart=charts.line_chart(
                {k: v for k, v in lag_series(samples).items() if k == name},
                title=f"Lag of {name}",
                unit="messages",
                chart_id="chart-group-lag",
            ),
            consumed_chart=charts.line_chart(
                {k: v for k, v in consumed_rates(samples).items() if k == name},
                title=f"Consumed by {name}",
                unit="msg/s",
                chart_id="chart-group-consumed",
            ),
        )

    # ------------------------------------------------------------------ messages
    @app.route("/messages")
    def messages() -> str:
        form = {
            k: request.args.get(k, "").strip()
            for k in ("by", "value", "topic", "since", "until", "limit")
        }
        by = form["by"] or "key"
        result, error = None, None
        if form["value"] or (by == "time" and form["topic"]):
            try:
                limit = int(form["limit"] or 50)
                since, until = _parse_time(form["since"]), _parse_time(form["until"])
                params: dict[str, Any] = {
                    "limit": limit,
                    "topic": form["topic"] or None,
                    "since_ms": since,
                    "until_ms": until,
                }
                if by == "id":
                    params["id"] = form["value"]
                elif by == "key":
                    params["key"] = form["value"]
                elif by == "unique_key":
                    params["unique_key"] = form["value"]
                elif by == "time" and since is None and until is None:
                    params["since_ms"] = 0
                result = view.query(**params)
            except ValueError as exc:
                error = str(exc)
            except AdminCallError as exc:
                error = str(exc)
        topics = sorted(t["name"] for t in view.topics())
        return render_template(
            "messages.html",
            title="Messages",
            form=form,
            by=by,
            result=result,
            error=error,
            topics=topics,
        )

    @app.route("/trace")
    def trace() -> str:
        key = request.args.get("key", "").strip()
        if not key:
            abort(404)
        try:
            doc = view.trace(key)
        except AdminCallError as exc:
            return render_template("error.html", title="Trace", message=str(exc))
        outbox_doc, outbox_error = None, None
        if settings.db_url:
            from reliable_cli.admin_call import CommandFailed
            from reliable_cli.admin_trace import outbox_trace, timeline

            try:
                outbox_doc = outbox_trace(
                    settings.db_url, settings.table_prefix, settings.schema, key, doc["message_ids"]
                )
                doc["events"] = timeline(doc["events"], outbox_doc.pop("events"))
            except CommandFailed as exc:
                outbox_error = str(exc)
        groups = sorted(g["name"] for g in view.groups())
        return render_template(
            "trace.html",
            title=f"Message {key}",
            key=key,
            doc=doc,
            outbox=outbox_doc,
            outbox_error=outbox_error,
            groups=groups,
        )

    @app.route("/reconsume", methods=["POST"])
    def reconsume() -> Any:
        require_actions()
        msg_id = request.form.get("id", "").strip()
        group_name = request.form.get("group", "").strip()
        if not msg_id or not group_name:
            abort(400)
        if request.form.get("step") != "confirm":
            return render_template(
                "confirm_reconsume.html",
                title="Confirm reconsume",
                msg_id=msg_id,
                group=group_name,
                key=request.form.get("key", msg_id),
            )
        try:
            done = view.reconsume(msg_id, group_name, operator=_operator())
        except AdminCallError as exc:
            return render_template("error.html", title="Reconsume refused", message=str(exc))
        log.warning("console: %s reconsumed %s to %s", _operator(), msg_id, group_name)
        return render_template(
            "done.html",
            title="Reconsumed",
            result=done,
            back=url_for("trace", key=request.form.get("key", msg_id)),
        )

    def _operator() -> str:
        return f"console:{current_user() or 'unknown'}"

    # ------------------------------------------------------------------ dead letters
    @app.route("/dlq")
    def dlq_index() -> str:
        latest = sampler.latest()
        return render_template("dlq_index.html", title="Dead letters", sample=latest)

    @app.route("/dlq/<path:group_name>")
    def dlq(group_name: str) -> str:
        listing, fallback = None, False
        try:
            listing = view.dead_letters(group_name, limit=200)
        except NotAvailable:
            from broker.names import dlq_topic

            fallback = True
            try:
                listing = view.query(topic=dlq_topic(group_name), since_ms=0, limit=200)
            except AdminCallError:
                listing = {"messages": [], "more": False}
        return render_template(
            "dlq.html",
            title=f"Dead letters of {group_name}",
            group=group_name,
            listing=listing,
            fallback=fallback,
            rate=DEFAULT_REPLAY_RATE,
            replay_available=view.available("ReplayDeadLetters"),
        )

    @app.route("/dlq/<path:group_name>/replay", methods=["POST"])
    def dlq_replay(group_name: str) -> Any:
        require_actions()
        try:
            offsets = sorted({int(o) for o in request.form.getlist("offset")})
            rate = int(request.form.get("rate") or 0) or None
        except ValueError:
            abort(400, "offsets and the rate must be whole numbers")
        if len(offsets) > MAX_REPLAY_IDS:
            abort(400, f"at most {MAX_REPLAY_IDS} dead letters at once")
        if rate is not None and not 1 <= rate <= MAX_REPLAY_RATE:
            abort(400, f"rate must be 1..{MAX_REPLAY_RATE} messages per second")
        if not offsets:
            return render_template(
                "error.html", title="Nothing to replay", message="select at least one dead letter"
            )
        to_topic = request.form.get("to_topic") == "1"
        if request.form.get("step") != "confirm":
            try:  # the broker's own dry run: what would go where, what it would skip
                preview = view.replay(
                    group_name,
                    offsets,
                    dry_run=True,
                    operator=_operator(),
                    run="console-dry-run",
                    to_topic=to_topic,
                )
            except AdminCallError as exc:
                return render_template("error.html", title="Replay refused", message=str(exc))
            return render_template(
                "confirm_replay.html",
                title="Confirm replay",
                group=group_name,
                offsets=offsets,
                rate=rate,
                to_topic=to_topic,
                preview=preview,
            )
        job = jobs.start(group_name, offsets, rate, to_topic, _operator())
        return redirect(url_for("dlq_job", group_name=group_name, job_id=job.id))

    @app.route("/dlq/<path:group_name>/jobs/<job_id>")
    def dlq_job(group_name: str, job_id: str) -> str:
        job = jobs.get(job_id)
        if job is None or job.group != group_name:
            abort(404, "no such replay (the console keeps the last 50 since it started)")
        return render_template(
            "replay_job.html",
            title=f"Replay {job.id}",
            job=job,
            refresh=None if job.finished else 1,
        )

    # ------------------------------------------------------------------ database
    def need_db() -> OutboxView:
        if outbox is None:
            abort(404, "start the console with --db URL to see the outbox")
        return outbox

    @app.route("/outbox")
    def outbox_page() -> str:
        db = need_db()
        backlog = db.backlog()
        return render_template(
            "outbox.html",
            title="Outbox",
            backlog=backlog,
            db=db,
            max_age=max([n for _, n in backlog.ages] + [1]),
        )

    @app.route("/reconcile")
    def reconcile_page() -> str:
        db = need_db()
        return render_template(
            "reconcile.html", title="Reconciliation", db=db, runs=db.reconcile_runs()
        )

    return app


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
