"""The outbox's database (the console started with --db): the stub backlog by status and
age, and the last reconciliation runs with their certificates."""

from __future__ import annotations

from flask import Blueprint, abort, render_template

from reliable_cli.console.database import OutboxView


def blueprint(outbox: OutboxView | None) -> Blueprint:
    pages = Blueprint("outbox", __name__)

    def need_db() -> OutboxView:
        if outbox is None:
            abort(404, "start the console with --db URL to see the outbox")
        return outbox

    @pages.route("/outbox")
    def backlog() -> str:
        db = need_db()
        stubs = db.backlog()
        return render_template(
            "outbox.html",
            title="Outbox",
            backlog=stubs,
            db=db,
            max_age=max([n for _, n in stubs.ages] + [1]),
        )

    @pages.route("/reconcile")
    def reconcile() -> str:
        db = need_db()
        return render_template(
            "reconcile.html", title="Reconciliation", db=db, runs=db.reconcile_runs()
        )

    return pages
