"""When spans are made: never before the application sets a tracer provider (they would be
non-recording and cost more than a send), always after; and the provider check holds on an
OpenTelemetry API without the module global it reads."""

from __future__ import annotations

import types
from typing import Any

import pytest

from reliable import tracing


class _Proxy:
    pass


class _Provider:
    def __init__(self) -> None:
        self.tracers = 0

    def get_tracer(self, name: str) -> Any:
        self.tracers += 1
        return types.SimpleNamespace(name=name)


def fake_api(**module_globals: Any) -> Any:
    proxy = _Proxy()
    api = types.SimpleNamespace(ProxyTracerProvider=_Proxy, **module_globals)
    api.provider = proxy
    api.get_tracer_provider = lambda: api.provider
    return api


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "_provider", None)
    monkeypatch.setattr(tracing, "_tracer_of", None)
    monkeypatch.setattr(tracing, "_from_env", None)
    monkeypatch.delenv("OTEL_PYTHON_TRACER_PROVIDER", raising=False)


def test_no_provider_no_span_then_a_provider_set_later_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = fake_api(_TRACER_PROVIDER=None)
    monkeypatch.setattr(tracing, "_trace", lambda: api)
    with tracing.span("send", "t", kind="producer") as s:
        assert s is tracing._NO_SPAN
    provider = _Provider()
    api._TRACER_PROVIDER = api.provider = provider  # what set_tracer_provider does
    assert tracing._configured(api)
    assert tracing._tracer(api).name == tracing.TRACER_NAME
    assert tracing._tracer(api) is tracing._tracer(api) and provider.tracers == 1


def test_an_api_without_the_global_is_asked_publicly(monkeypatch: pytest.MonkeyPatch) -> None:
    api = fake_api()  # no _TRACER_PROVIDER attribute
    assert not tracing._configured(api)
    api.provider = _Provider()
    assert tracing._configured(api)


def test_a_provider_named_in_the_environment_is_asked_publicly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_PYTHON_TRACER_PROVIDER", "sdk_tracer_provider")
    api = fake_api(_TRACER_PROVIDER=None)  # not set yet: the public call would load it
    api.provider = _Provider()
    assert tracing._configured(api)


def test_the_installed_api_has_the_global_read() -> None:
    from opentelemetry import trace as otel  # a test dependency: missing is a failure

    assert hasattr(otel, "_TRACER_PROVIDER")  # else every span asks the slow public way
