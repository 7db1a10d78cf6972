"""The body digest of a delivered message: the Apache proxy's, MD5 as upper-case hex."""

from __future__ import annotations

import hashlib

import pytest

from broker.server.convert import body_digest, to_proto
from broker.store.message import MessageExt
from protocol.pb import definition_pb2
from protocol.props import Prop
from tests.interop.bodies import all_bodies, crafted_bodies, crc_hex


def stored(body: bytes) -> MessageExt:
    return MessageExt(
        topic="orders",
        body=body,
        queue_id=0,
        flag=0,
        properties={Prop.UNIQ_KEY: "U1"},
        sys_flag=0,
        born_timestamp=1,
        born_host=("127.0.0.1", 1),
        reconsume_times=0,
        prepared_tx_offset=0,
        queue_offset=0,
        commitlog_offset=0,
        store_timestamp=2,
        store_host=("127.0.0.1", 2),
        store_size=10,
        body_crc=0,
    )


def test_the_crafted_bodies_are_those_a_crc32_digest_gets_wrong() -> None:
    """Each has a CRC32 whose hex starts with zeros: unpadded (Java, Go) and padded
    (Python) hex differ for it, so a CRC32 digest fails one client or the other."""
    for body in crafted_bodies():
        crc = crc_hex(body)
        assert crc.startswith("0")
        assert f"{int(crc, 16):X}" != crc


@pytest.mark.parametrize("body", [b"x", *all_bodies()], ids=lambda b: bytes(b[:12]).decode())
def test_a_delivered_message_carries_the_md5_of_its_body_in_upper_case_hex(body: bytes) -> None:
    pm = to_proto(
        stored(body), topic="orders", namespace="", receipt_handle="h", delivery_attempt=1
    )
    digest = pm.system_properties.body_digest
    assert digest.type == definition_pb2.DigestType.Value("MD5")
    # what every official client computes for MD5: upper-case hex of the 16 bytes
    assert digest.checksum == hashlib.md5(body).hexdigest().upper()
    assert len(digest.checksum) == 32
    assert pm.system_properties.body_encoding == definition_pb2.Encoding.Value("IDENTITY")
    assert pm.body == body


def test_the_digest_reads_any_buffer() -> None:
    body = b"plain" * 100
    want = hashlib.md5(body).hexdigest().upper()
    assert (
        body_digest(body) == body_digest(bytearray(body)) == body_digest(memoryview(body)) == want
    )
