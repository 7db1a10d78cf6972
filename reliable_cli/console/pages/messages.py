"""Finding messages: the search, one message's trace, and reconsuming it by a group."""

from __future__ import annotations

import logging

from flask import Blueprint, abort, render_template, request, url_for
from flask.typing import ResponseReturnValue

from reliable.admin import AdminCallError
from reliable_cli.console.broker_view import BrokerView
from reliable_cli.console.pages.auth import operator, require_actions
from reliable_cli.console.settings import Settings, parse_time

log = logging.getLogger(__name__)

SEARCH_FIELDS = ("by", "value", "topic", "since", "until", "limit")


def _query_params(form: dict[str, str], by: str) -> dict[str, object]:
    """The broker's query for the search form (ValueError for a bad number or time)."""
    limit = int(form["limit"] or 50)
    since, until = parse_time(form["since"]), parse_time(form["until"])
    params: dict[str, object] = {
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
    return params


def blueprint(settings: Settings, view: BrokerView) -> Blueprint:
    pages = Blueprint("messages", __name__)

    @pages.route("/messages")
    def search() -> str:
        form = {k: request.args.get(k, "").strip() for k in SEARCH_FIELDS}
        by = form["by"] or "key"
        result, error = None, None
        if form["value"] or (by == "time" and form["topic"]):
            try:
                result = view.query(**_query_params(form, by))
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

    @pages.route("/trace")
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

    @pages.route("/reconsume", methods=["POST"])
    def reconsume() -> ResponseReturnValue:
        require_actions(settings)
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
            done = view.reconsume(msg_id, group_name, operator=operator())
        except AdminCallError as exc:
            return render_template("error.html", title="Reconsume refused", message=str(exc))
        log.warning("console: %s reconsumed %s to %s", operator(), msg_id, group_name)
        return render_template(
            "done.html",
            title="Reconsumed",
            result=done,
            back=url_for(".trace", key=request.form.get("key", msg_id)),
        )

    return pages
