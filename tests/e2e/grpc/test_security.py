"""TLS and MQv2-HMAC-SHA1 access keys, with the official client and the grpc transport."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import reliable
from bench._tls import self_signed
from reliable import Message, Producer, SimpleConsumer
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import REPO, ServerProcess


def test_tls_with_official_client_and_grpc_transport(
    tmp_path: Path, make_server: Callable[..., ServerProcess], client_home: Path
) -> None:
    cert, key = self_signed(tmp_path)
    server = make_server("--tls-cert", str(cert), "--tls-key", str(key))
    # the official client trusts a private CA only through this variable, read once per
    # process: it runs in a child process
    script = textwrap.dedent(f"""
        from tests.e2e.grpc import official
        from rocketmq import Producer
        p = Producer(official.configuration("{server.endpoint}"), ["t-tls"], tls_enable=True)
        p.startup()
        print(p.send(official.message("t-tls", b"secret")).message_id)
        p.shutdown()
    """)
    env = dict(
        os.environ,
        HOME=str(client_home),
        GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(cert),
        PYTHONPATH=str(REPO),
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    sent_id = out.stdout.strip().splitlines()[-1]

    t = reliable.connect("grpc", endpoint=server.endpoint, tls=True, ca_file=str(cert))
    t.start()
    try:
        with SimpleConsumer(
            "g-tls", {"t-tls": "*"}, transport=t, await_duration_s=1, invisible_duration_s=15
        ) as consumer:
            got: list[reliable.ReceivedMessage] = []
            assert official.wait_for(
                lambda: bool(got.extend(consumer.receive()) or got), timeout_s=30, interval_s=0
            )
            assert [m.message_id for m in got] == [sent_id]
            assert got[0].body == b"secret"
    finally:
        t.close()
    # plaintext against a TLS port gets nowhere
    plain = reliable.connect("grpc", endpoint=server.endpoint, request_timeout_s=2)
    plain.start()
    try:
        with pytest.raises(reliable.TransportError):
            plain.route("t-tls")
    finally:
        plain.close()


def test_access_keys(tmp_path: Path, make_server: Callable[..., ServerProcess]) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"app-key": "app-secret"}))
    server = make_server("--credentials-file", str(keys))
    # the official client signs its local time: accepted
    producer = official.producer(server.endpoint, ["t-auth"], ak="app-key", sk="app-secret")
    consumer = official.simple_consumer(
        server.endpoint, "g-auth", "t-auth", ak="app-key", sk="app-secret"
    )
    try:
        mid = producer.send(official.message("t-auth", b"signed")).message_id
        got = official.receive_until(consumer, lambda g: len(g) >= 1)
        assert [m.message_id for m in got] == [mid]
    finally:
        producer.shutdown()
        consumer.shutdown()
    # a wrong secret, and no signature at all: refused
    for ak, sk in (("app-key", "wrong"), ("", "")):
        t = reliable.connect("grpc", endpoint=server.endpoint, access_key=ak, secret_key=sk)
        t.start()
        try:
            with pytest.raises(reliable.BrokerCallError) as info:
                t.route("t-auth")
            assert info.value.code == "UNAUTHORIZED"
        finally:
            t.close()
    # the framework's transport signs too
    with Producer(
        "grpc", endpoint=server.endpoint, access_key="app-key", secret_key="app-secret"
    ) as framework:
        assert framework.send(Message("t-auth", b"framework")).message_id
