"""Dead letters: per group, their listing, a replay confirmed by the broker's dry run, and
the replay's progress."""

from __future__ import annotations

from flask import Blueprint, abort, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from reliable.admin import AdminCallError
from reliable_cli.console.broker_view import BrokerView, NotAvailable
from reliable_cli.console.pages.auth import operator, require_actions
from reliable_cli.console.replay import ReplayJobs
from reliable_cli.console.sampler import Sampler
from reliable_cli.console.settings import Settings

MAX_REPLAY_RATE = 1000  # messages per second a replay may be asked for
MAX_REPLAY_IDS = 1000  # the broker's limit of one replay call
DEFAULT_REPLAY_RATE = 10


def _replay_request() -> tuple[list[int], int | None]:
    """The offsets and rate the replay form asks for; 400 unless they are in range."""
    try:
        offsets = sorted({int(o) for o in request.form.getlist("offset")})
        rate = int(request.form.get("rate") or 0) or None
    except ValueError:
        abort(400, "offsets and the rate must be whole numbers")
    if len(offsets) > MAX_REPLAY_IDS:
        abort(400, f"at most {MAX_REPLAY_IDS} dead letters at once")
    if rate is not None and not 1 <= rate <= MAX_REPLAY_RATE:
        abort(400, f"rate must be 1..{MAX_REPLAY_RATE} messages per second")
    return offsets, rate


def blueprint(settings: Settings, view: BrokerView, sampler: Sampler) -> Blueprint:
    pages = Blueprint("dead_letters", __name__)
    jobs = ReplayJobs(view)

    @pages.route("/dlq")
    def index() -> str:
        latest = sampler.latest()
        return render_template("dlq_index.html", title="Dead letters", sample=latest)

    @pages.route("/dlq/<path:group_name>")
    def group(group_name: str) -> str:
        listing, fallback = None, False
        try:
            listing = view.dead_letters(group_name, limit=200)
        except NotAvailable:
            from protocol.names import dlq_topic

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

    @pages.route("/dlq/<path:group_name>/replay", methods=["POST"])
    def replay(group_name: str) -> ResponseReturnValue:
        require_actions(settings)
        offsets, rate = _replay_request()
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
                    operator=operator(),
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
        job = jobs.start(group_name, offsets, rate, to_topic, operator())
        return redirect(url_for(".job", group_name=group_name, job_id=job.id))

    @pages.route("/dlq/<path:group_name>/jobs/<job_id>")
    def job(group_name: str, job_id: str) -> str:
        found = jobs.get(job_id)
        if found is None or found.group != group_name:
            abort(404, "no such replay (the console keeps the last 50 since it started)")
        return render_template(
            "replay_job.html",
            title=f"Replay {found.id}",
            job=found,
            refresh=None if found.finished else 1,
        )

    return pages
