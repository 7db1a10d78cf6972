"""The resend worker's sender and offsets in the served-topology outbox test: a producer on
the grpc transport to `OUTBOX_E2E_ENDPOINT` (`--sender tests.e2e.grpc.outbox_app:producer`)
and the committed offsets of that server (`--offsets tests.e2e.grpc.outbox_app:offsets`)."""

from __future__ import annotations

import os

from outbox.adapters import TransportOffsets
from reliable import Producer, connect


def producer() -> Producer:
    return Producer("grpc", endpoint=os.environ["OUTBOX_E2E_ENDPOINT"]).start()


def offsets() -> TransportOffsets:
    transport = connect("grpc", endpoint=os.environ["OUTBOX_E2E_ENDPOINT"])
    transport.start()
    return TransportOffsets(transport)
