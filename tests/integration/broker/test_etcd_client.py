"""The etcd client automatic failover uses (`broker.ha.etcd`), against a real etcd
(Debian's etcd-server, started here on free loopback ports): its calls in plaintext, and
over TLS with client certificates (`etcds://`, etcd's `--client-cert-auth`), where a
client without a certificate, one trusting another CA, and a plaintext client get
nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from bench._failover import Etcd, etcd_binary
from bench._tls import MutualTls, mutual_tls
from broker.ha.etcd import Compare, CoordinatorUnavailable, EtcdClient, Put


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> MutualTls:
    return mutual_tls(tmp_path_factory.mktemp("etcd-tls"))


@pytest.fixture(scope="module", params=["plaintext", "tls"])
def etcd(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, certs: MutualTls
) -> Iterator[Etcd]:
    assert etcd_binary(), "etcd is not installed: apt-get install etcd-server"
    server = Etcd(
        tmp_path_factory.mktemp("etcd") / "data", certs if request.param == "tls" else None
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_leases_keys_and_compare_and_set(etcd: Etcd) -> None:
    client = etcd.client(timeout_s=2.0)
    lease, ttl = client.grant(5)
    assert lease > 0 and ttl == 5
    assert client.keepalive(lease) == 5
    key = b"/reliable/test/" + etcd.url.split(":")[0].encode() + b"/leader"
    assert client.get(key) is None
    # the first compare-and-set on an absent key wins, a second with the same view loses
    assert client.txn([Compare(key, 0)], [Put(key, b"one", lease)])
    assert not client.txn([Compare(key, 0)], [Put(key, b"two", lease)])
    kv = client.get(key)
    assert kv is not None and kv.value == b"one" and kv.lease == lease
    assert client.txn([Compare(key, kv.mod_revision)], [Put(key, b"three", lease)])
    assert [k.value for k in client.get_prefix(b"/reliable/test/")] == [b"three"]
    client.revoke(lease)  # its keys go with it
    assert client.get(key) is None
    assert client.keepalive(lease) == 0


@pytest.mark.parametrize("etcd", ["tls"], indirect=True)
def test_a_tls_etcd_refuses_clients_without_the_right_certificates(
    etcd: Etcd, certs: MutualTls, tmp_path: Path
) -> None:
    port = etcd.client_port
    plaintext = EtcdClient("127.0.0.1", port, timeout_s=2.0)
    no_certificate = EtcdClient.from_url(etcd.url, timeout_s=2.0, ca_file=str(certs.ca))
    other = mutual_tls(tmp_path / "other")  # a CA etcd does not trust, and it trusts not etcd's
    other_ca = EtcdClient.from_url(
        etcd.url,
        timeout_s=2.0,
        ca_file=str(other.ca),
        cert_file=str(other.client_cert),
        key_file=str(other.client_key),
    )
    foreign_client = EtcdClient.from_url(
        etcd.url,
        timeout_s=2.0,
        ca_file=str(certs.ca),
        cert_file=str(other.client_cert),
        key_file=str(other.client_key),
    )
    for client in (plaintext, no_certificate, other_ca, foreign_client):
        with pytest.raises(CoordinatorUnavailable):
            client.grant(5)
    assert etcd.client(timeout_s=2.0).grant(5)[0] > 0  # the right certificates still work


def test_tls_files_are_checked_where_they_are_given(certs: MutualTls) -> None:
    with pytest.raises(ValueError, match="plaintext"):
        EtcdClient.from_url("etcd://127.0.0.1:2379", ca_file=str(certs.ca))
    with pytest.raises(ValueError, match="needs its key"):
        EtcdClient.from_url("etcds://127.0.0.1:2379", cert_file=str(certs.client_cert))
    with pytest.raises(ValueError, match="cannot load"):
        EtcdClient.from_url("etcds://127.0.0.1:2379", ca_file="/nonexistent/ca.pem")
    with pytest.raises(ValueError, match="etcds://"):
        EtcdClient.from_url("ftp://127.0.0.1:2379")
