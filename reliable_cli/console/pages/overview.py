"""The overview and the pages it links to: one topic, one consumer group."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, render_template

from reliable_cli.console import charts
from reliable_cli.console.broker_view import BrokerView, NotAvailable, is_user_topic
from reliable_cli.console.sampler import Sampler, consumed_rates, lag_series, produced_rates
from reliable_cli.console.settings import Settings


def blueprint(settings: Settings, view: BrokerView, sampler: Sampler) -> Blueprint:
    pages = Blueprint("overview", __name__)

    @pages.route("/")
    def index() -> str:
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

    @pages.route("/topics/<path:name>")
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

    @pages.route("/groups/<path:name>")
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

    return pages
