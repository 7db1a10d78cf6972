"""The console's pure parts: charts, rates from samples, login and CSRF checks, run times."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path

import pytest

from reliable_cli.console import security
from reliable_cli.console.broker_view import GroupLag
from reliable_cli.console.charts import line_chart
from reliable_cli.console.database import run_time
from reliable_cli.console.sampler import Sample, consumed_rates, lag_series, produced_rates


def test_a_chart_draws_one_line_per_series_ending_at_the_last_value() -> None:
    svg = str(
        line_chart(
            {"billing": [(0, 300), (5, 120), (10, 0)], "<b>x</b>": [(0, 1), (10, 2)]},
            title="Consumer lag",
            unit="messages",
            chart_id="c",
        )
    )
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count("<polyline") == 2 and 'data-points="5"' in svg
    assert 'data-name="billing" data-last="0"' in svg
    assert "<b>x</b>" not in svg and "&lt;b&gt;x&lt;/b&gt;" in svg  # names are escaped
    assert "style=" not in svg and "<script" not in svg  # the page's CSP allows neither
    # the highest point sits on the top gridline's scale (a 1-2-5 ceiling of 300: 500)
    assert ">500</text>" in svg


def test_a_chart_with_fewer_than_two_points_says_it_is_collecting() -> None:
    svg = str(line_chart({"a": [(0, 1)]}, title="t", unit="u", chart_id="c"))
    assert "collecting samples" in svg and "<polyline" not in svg


def sample(at: float, stored: int, lag: int, consumed: int) -> Sample:
    return Sample(
        at, {"orders": stored}, {"billing": GroupLag("billing", lag=lag, consumed=consumed)}
    )


def test_rates_are_differences_of_offsets_between_samples() -> None:
    samples = [
        sample(0, 100, 100, 0),
        sample(2, 140, 60, 80),
        sample(4, 140, 0, 140),
        sample(6, 10, 0, 0),
    ]  # a deleted and re-created topic: no negative rate
    assert produced_rates(samples) == {"orders": [(2, 20.0), (4, 0.0)]}
    assert consumed_rates(samples) == {"billing": [(2, 40.0), (4, 30.0)]}
    assert lag_series(samples) == {"billing": [(0, 100.0), (2, 60.0), (4, 0.0), (6, 0.0)]}


def test_password_login_and_basic_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(security, "FAILED_LOGIN_DELAY_S", 0.0)
    auth = security.Authenticator("password", password="s3cret-pass")
    assert auth.check("anyone", "s3cret-pass") and not auth.check("anyone", "s3cret-pas")

    def basic(text: str) -> str:
        return "Basic " + base64.b64encode(text.encode()).decode()

    assert auth.check_basic(basic("ops:s3cret-pass")) == "ops"
    assert auth.check_basic(basic("ops:wrong")) is None
    assert auth.check_basic("Basic !!!") is None and auth.check_basic(None) is None
    asked: list[tuple[str, str]] = []
    by_broker = security.Authenticator(
        "broker-key", broker_check=lambda ak, sk: asked.append((ak, sk)) or sk == "sk1"
    )
    assert by_broker.check("ak1", "sk1") and not by_broker.check("", "sk1")
    assert asked == [("ak1", "sk1")]  # an empty key never reaches the broker


def test_a_password_file_needs_a_real_password(tmp_path: Path) -> None:
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(security.AuthSetupError, match="at least 8"):
        security.read_password(short)
    with pytest.raises(security.AuthSetupError, match="missing"):
        security.read_password(tmp_path / "missing")
    good = tmp_path / "good"
    good.write_text("  correct horse  \nsecond line\n")
    assert security.read_password(good) == "correct horse"


def test_csrf_and_origin_checks() -> None:
    token = security.new_csrf_token()
    assert security.csrf_ok({"csrf": token}, token)
    assert not security.csrf_ok({"csrf": token}, token[:-1] + "x")
    assert not security.csrf_ok({}, token) and not security.csrf_ok({"csrf": token}, None)
    host = "http://127.0.0.1:8080/"
    assert security.same_origin("http://127.0.0.1:8080", None, host)
    assert not security.same_origin("http://evil.example", None, host)
    assert not security.same_origin(None, "http://127.0.0.1:8080.evil.example/x", host)
    assert security.same_origin(None, "http://127.0.0.1:8080/dlq/g", host)
    assert security.same_origin(None, None, host)  # a script: the token alone decides


def test_a_run_id_says_when_the_run_was() -> None:
    assert run_time("20261124T003000-1a2b3c4d") == datetime(2026, 11, 24, 0, 30, tzinfo=UTC)
    assert run_time("my-own-run") is None


def test_the_command_refuses_to_start_without_a_way_to_log_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from reliable_cli import main

    ep = ("console", "--endpoint", "127.0.0.1:1")
    assert main([*ep]) == 2
    assert "give --password-file" in capsys.readouterr().err
    assert main([*ep, "--no-auth", "--allow-actions"]) == 2
    assert "--no-auth only for a read-only console" in capsys.readouterr().err
    assert main([*ep, "--no-auth", "--host", "0.0.0.0"]) == 2
    short = tmp_path / "pw"
    short.write_text("short\n")
    assert main([*ep, "--password-file", str(short)]) == 2
    assert "at least 8 characters" in capsys.readouterr().err
    assert main([*ep, "--access-key", "ops"]) == 2
    assert "--secret-key-file" in capsys.readouterr().err


def test_login_never_redirects_to_another_site(monkeypatch: pytest.MonkeyPatch) -> None:
    import re

    from reliable_cli.console.app import Settings, create_app
    from reliable_cli.console.broker_view import BrokerView
    from reliable_cli.console.sampler import Sampler

    view = BrokerView("127.0.0.1:1")  # the login page never calls the broker
    auth = security.Authenticator("password", password="s3cret-pass")
    app = create_app(Settings(endpoint="127.0.0.1:1", auth=auth), view, Sampler(view), None)
    try:
        for target, expected in (
            ("//evil.example/x", "/"),
            ("/\\evil.example", "/"),
            ("https://evil.example", "/"),
            ("/dlq?x=1", "/dlq?x=1"),
        ):
            client = app.test_client()
            page = client.get("/login").get_data(as_text=True)
            token = re.search(r'name="csrf" value="([^"]+)"', page)
            assert token
            answer = client.post(
                "/login",
                query_string={"next": target},
                data={"csrf": token.group(1), "user": "u", "password": "s3cret-pass"},
            )
            assert answer.status_code == 302 and answer.headers["Location"] == expected, target
            assert "frame-ancestors 'none'" in answer.headers["Content-Security-Policy"]
        forged = app.test_client().post("/login", data={"user": "u", "password": "s3cret-pass"})
        assert forged.status_code == 403  # a login form posted from elsewhere has no token
    finally:
        view.close()
