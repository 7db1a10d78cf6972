"""The replication port against peers that lie, hog memory, lack the keys or belong to
another broker group; and replication over TLS with access keys (docs/ha.md, "Who may
replicate"). Real broker processes; the hostile peers are raw sockets speaking the
replication protocol byte by byte, as laid out in docs/ha.md."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import reliable
from bench._tls import self_signed
from protocol.ports import free_port
from reliable import Message, Producer
from tests.e2e.grpc import official
from tests.e2e.grpc.server_process import ServerProcess, admin_json, stored_records

FIXED = struct.Struct(">4sBBqiiq")  # magic, version, kind, offset, broker id, epoch, start
FRAME = struct.Struct(">qI")
CHALLENGE, PROOF, POSITION, CONFIG = -4, -5, -2, -1
KEYS = {"ha-key": "ha-secret", "app-key": "app-secret"}


def _hello(offset: int, *, group: str = "broker-a", key: str = "", version: int = 4) -> bytes:
    fixed = FIXED.pack(b"RLHA", version, 0, offset, 1, 1, 0)
    g, k = group.encode(), key.encode()
    return fixed + bytes([len(g)]) + g + bytes([len(k)]) + k + os.urandom(32)


def _read_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < FRAME.size:
        chunk = sock.recv(FRAME.size - len(head))
        assert chunk, "closed"
        head += chunk
    offset, length = FRAME.unpack(head)
    body = b""
    while len(body) < length:
        chunk = sock.recv(length - len(body))
        assert chunk, "closed"
        body += chunk
    return offset, body


def _until_closed(sock: socket.socket, timeout_s: float = 20.0) -> bytes:
    """Every byte the master sends until it closes the connection (fails if it does not)."""
    sock.settimeout(timeout_s)
    got = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except ConnectionResetError:
            break
        if not chunk:
            break
        got += chunk
    return bytes(got)


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos + FRAME.size <= len(data):
        offset, length = FRAME.unpack_from(data, pos)
        pos += FRAME.size
        out.append((offset, data[pos : pos + length]))
        pos += length
    return out


def _status(endpoint: str) -> dict[str, Any]:
    value: dict[str, Any] = admin_json("broker", "status", "--endpoint", endpoint)
    return value


def _vm_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _keys(tmp_path: Path) -> Path:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(KEYS))
    return path


def test_a_forged_report_is_dropped_and_acknowledges_nothing(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    ha_port = free_port()
    master = make_server(
        "--role",
        "sync-master",
        "--ha-port",
        str(ha_port),
        "--ha-sync-timeout-ms",
        "1500",
        store=tmp_path / "m",
    )
    with pytest.raises(Exception, match=r"HA_NOT_AVAILABLE|no slave"):  # stored, not replicated
        official.producer(master.endpoint, ["t-forged"]).send(official.message("t-forged", b"x"))
    end = _status(master.endpoint)["max_offset"]
    assert end > 0
    peer = socket.create_connection(("127.0.0.1", ha_port), timeout=20)
    try:
        peer.sendall(_hello(end))  # "my log ends where yours does"
        assert official.wait_for(lambda: len(_status(master.endpoint)["slaves"]) == 1)
        outcome: list[BaseException | str] = []

        def send() -> None:
            producer = official.producer(master.endpoint, ["t-forged"])
            try:
                outcome.append(producer.send(official.message("t-forged", b"y")).message_id)
            except Exception as exc:
                outcome.append(exc)
            finally:
                producer.shutdown()

        sender = threading.Thread(target=send)
        sender.start()
        time.sleep(0.5)  # the send waits for this peer's acknowledgement
        peer.sendall(struct.pack(">q", 1 << 60))
        _until_closed(peer)  # dropped
        sender.join(60)
    finally:
        peer.close()
    assert len(outcome) == 1 and isinstance(outcome[0], Exception), outcome
    # the official client's last attempt answered: 50402 (SLAVE_PERSISTENCE_TIMEOUT) or
    # 50002 (HA_NOT_AVAILABLE, once the peer was dropped), never SEND_OK
    assert "not acknowledged by a slave" in str(outcome[0]), outcome
    status = _status(master.endpoint)
    assert status["slaves"] == []
    assert status["acked_checkpoint"] is None or status["acked_checkpoint"] <= end
    assert master.terminate() == 0, "".join(master.output)
    log = "".join(master.output)
    assert "refused (violation)" in log and str(1 << 60) in log
    from broker.ha.state import read_acked

    assert read_acked(tmp_path / "m") <= end  # nothing of that link was persisted


def test_an_oversized_length_is_refused_and_memory_stays_flat(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    ha_port = free_port()
    master = make_server("--role", "async-master", "--ha-port", str(ha_port), store=tmp_path / "m")
    assert master.proc is not None
    pid = master.proc.pid
    before = _vm_rss_kib(pid)
    # a hello, an acting-report marker and a length of 2^30: 42 bytes
    attack = _hello(0) + struct.pack(">q", -1) + struct.pack(">I", 1 << 30)
    for _ in range(6):
        with socket.create_connection(("127.0.0.1", ha_port), timeout=20) as peer:
            peer.sendall(attack)
            _until_closed(peer)  # refused at once
    # lengths within the limit, and nothing behind them: nothing allocated for them either
    held = []
    for _ in range(6):
        peer = socket.create_connection(("127.0.0.1", ha_port), timeout=20)
        peer.sendall(_hello(0) + struct.pack(">q", -1) + struct.pack(">I", 60 << 20))
        held.append(peer)
    time.sleep(1.0)
    during = _vm_rss_kib(pid)
    for peer in held:
        peer.close()
    after = _vm_rss_kib(pid)
    grown_mib = (max(during, after) - before) / 1024
    assert grown_mib < 48, (before, during, after)
    assert master.alive()
    log = "".join(master.output)
    assert "refused (violation)" in log and "an acting report of 1073741824 bytes" in log


def _collect(port: int, hello: bytes, proof: bytes | None = None) -> bytes:
    """What a peer that says `hello` (and, asked, sends `proof`) receives before the
    master closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as peer:
        peer.sendall(hello)
        if proof is None:
            return _until_closed(peer)
        offset, body = _read_frame(peer)
        assert offset == CHALLENGE and len(body) == 32
        peer.sendall(proof)
        return FRAME.pack(offset, len(body)) + body + _until_closed(peer)


def test_a_peer_without_the_keys_gets_nothing(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    ha_port = free_port()
    master = make_server(
        "--role",
        "async-master",
        "--ha-port",
        str(ha_port),
        "--credentials-file",
        str(_keys(tmp_path)),
        store=tmp_path / "m",
    )
    producer = official.producer(master.endpoint, ["t-keys"], ak="app-key", sk="app-secret")
    try:
        for i in range(20):
            producer.send(official.message("t-keys", b"confidential-%d" % i))
    finally:
        producer.shutdown()
    attempts = {
        "no key": _collect(ha_port, _hello(0)),
        "wrong secret": _collect(ha_port, _hello(0, key="ha-key"), os.urandom(32)),
        "unknown key": _collect(ha_port, _hello(0, key="nobody"), os.urandom(32)),
        "old version": _collect(ha_port, _hello(0, version=3)),
    }
    for name, data in attempts.items():
        assert b"confidential" not in data and b"t-keys" not in data, name
        frames = _frames(data)
        kinds = [offset for offset, _ in frames]
        assert all(k in (CHALLENGE, POSITION) for k in kinds), (name, kinds)
        assert kinds[-1] == POSITION, name
        refusal = json.loads(frames[-1][1])
        # why, and the reason in one word: no offsets, no epochs
        assert set(refusal) == {"refused", "reason"}, (name, refusal)
    assert "version 3" in json.loads(_frames(attempts["old version"])[-1][1])["refused"]
    # a slave with the right key, of the same group, is served
    proof_ok = _authenticated(ha_port, group="broker-a")
    assert proof_ok[0] == "served"
    log = "".join(master.output)
    assert "refused (auth)" in log and "refused (version)" in log
    assert "ha-secret" not in log


def _authenticated(port: int, *, group: str) -> tuple[str, list[int]]:
    """A peer that holds "ha-key": ("served", frame kinds) once it gets records or a
    config frame after the master's proof, ("refused: why", kinds) when refused."""
    hello = _hello(0, group=group, key="ha-key")
    with socket.create_connection(("127.0.0.1", port), timeout=20) as peer:
        peer.sendall(hello)
        offset, challenge = _read_frame(peer)
        assert offset == CHALLENGE
        mine = hmac.new(b"ha-secret", b"RLHA4 slave\0" + hello + challenge, hashlib.sha256).digest()
        peer.sendall(mine)
        offset, body = _read_frame(peer)
        if offset == POSITION:
            return f"refused: {json.loads(body)['refused']}", [offset]
        assert offset == PROOF
        expected = hmac.new(
            b"ha-secret", b"RLHA4 master\0" + hello + challenge + mine, hashlib.sha256
        ).digest()
        assert hmac.compare_digest(body, expected)  # the master holds the key too
        offset, _ = _read_frame(peer)
        return ("served" if offset == CONFIG or offset >= 0 else "other"), [offset]


def test_a_peer_of_another_group_is_refused(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    ha_port = free_port()
    keys = _keys(tmp_path)
    master = make_server(
        "--role",
        "async-master",
        "--ha-port",
        str(ha_port),
        "--credentials-file",
        str(keys),
        store=tmp_path / "m",
    )
    verdict, _ = _authenticated(ha_port, group="broker-b")
    assert verdict.startswith("refused: it is of broker group 'broker-b'"), verdict
    # a real slave of another group: refused, and says so
    slave = make_server(
        "--role",
        "slave",
        "--broker-name",
        "broker-b",
        "--broker-id",
        "1",
        "--master",
        f"127.0.0.1:{ha_port}",
        "--ha-port",
        str(free_port()),
        "--credentials-file",
        str(keys),
        store=tmp_path / "s",
    )
    assert official.wait_for(
        lambda: "broker group" in str(_status_signed(slave.endpoint).get("refused"))
    )
    assert _status_signed(master.endpoint)["slaves"] == []
    assert "refused (group)" in "".join(master.output)


def _status_signed(endpoint: str) -> dict[str, Any]:
    from reliable.admin import AdminClient

    admin = AdminClient(endpoint, access_key="app-key", secret_key="app-secret")
    try:
        return admin.ha_status()
    finally:
        admin.close()


def test_replication_over_tls_with_access_keys_end_to_end(
    make_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    keys = _keys(tmp_path)
    ha_port = free_port()
    common = ("--credentials-file", str(keys), "--tls-cert", str(cert), "--tls-key", str(key))
    master = make_server(
        "--role", "sync-master", "--ha-port", str(ha_port), *common, store=tmp_path / "m"
    )
    slave = make_server(
        "--role",
        "slave",
        "--broker-id",
        "1",
        "--master",
        f"127.0.0.1:{ha_port}",
        "--ha-port",
        str(free_port()),
        "--ha-tls-ca",
        str(cert),
        "--ha-access-key",
        "ha-key",
        *common,
        store=tmp_path / "s",
    )
    transport = reliable.connect(
        "grpc",
        endpoint=master.endpoint,
        tls=True,
        ca_file=str(cert),
        access_key="app-key",
        secret_key="app-secret",
    )
    transport.start()
    try:
        with Producer(transport) as producer:
            deadline = time.monotonic() + 30
            while True:  # a sync-master answers HA_NOT_AVAILABLE until its slave is linked
                try:
                    producer.send(Message("t-ha-tls", b"over-tls-0"))
                    break
                except reliable.ReliableError:
                    assert time.monotonic() < deadline, "".join(slave.output)
                    time.sleep(0.2)
            for i in range(1, 30):  # each answered once the slave has it
                producer.send(Message("t-ha-tls", b"over-tls-%d" % i))
    finally:
        transport.close()
    bodies = {r.body for r in stored_records(tmp_path / "s")}
    assert {b"over-tls-%d" % i for i in range(30)} <= bodies
    # a plaintext slave of a TLS master, and a slave without the key, get nothing
    plain = _collect(ha_port, _hello(0))
    assert b"over-tls" not in plain
    assert official.wait_for(lambda: "refused (tls)" in "".join(master.output))
    assert slave.terminate() == 0, "".join(slave.output)
    assert master.terminate() == 0, "".join(master.output)
