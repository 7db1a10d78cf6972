"""Certificates for TLS on loopback, made with the `openssl` command: a self-signed server
certificate (the client port, the HA link), and a small CA that signs a server and a client
certificate (mutual TLS, as etcd's `--client-cert-auth` wants). Used by the bench and the
tests; one day's validity, RSA 2048, names `localhost` and 127.0.0.1."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

_NAMES = "subjectAltName=IP:127.0.0.1,DNS:localhost"


def _openssl(*argv: str) -> None:
    subprocess.run(["openssl", *argv], check=True, capture_output=True)


def self_signed(directory: Path, name: str = "") -> tuple[Path, Path]:
    """(certificate, key) of a self-signed server certificate for localhost/127.0.0.1."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}cert.pem", directory / f"{name}key.pem"
    _openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
        *("-addext", _NAMES),
    )
    return cert, key


@dataclass(frozen=True)
class MutualTls:
    """A CA and the server and client certificates it signed (each with its key)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def mutual_tls(directory: Path) -> MutualTls:
    """A CA, a server certificate for localhost/127.0.0.1 and a client certificate
    (`CN=reliable`), each signed by the CA, in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca-key.pem"
    _openssl(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=reliable test CA"),
    )
    made: dict[str, tuple[Path, Path]] = {}
    # etcd's HTTP gateway dials etcd's own gRPC port with the server certificate: it
    # serves as a client certificate too
    for role, usage in (("server", "serverAuth,clientAuth"), ("client", "clientAuth")):
        cert, key, csr = (directory / f"{role}{ext}" for ext in (".pem", "-key.pem", ".csr"))
        extensions = directory / f"{role}.ext"
        extensions.write_text(f"{_NAMES}\nextendedKeyUsage={usage}\n")
        subject = "/CN=localhost" if role == "server" else "/CN=reliable"
        _openssl(
            *("req", "-new", "-newkey", "rsa:2048", "-nodes"),
            *("-keyout", str(key), "-out", str(csr), "-subj", subject),
        )
        _openssl(
            *("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)),
            *("-CAcreateserial", "-days", "1", "-out", str(cert), "-extfile", str(extensions)),
        )
        made[role] = (cert, key)
    return MutualTls(ca, *made["server"], *made["client"])
