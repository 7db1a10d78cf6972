"""The resend worker's sender in the served-topology outbox test: a producer on the grpc
transport to `OUTBOX_E2E_ENDPOINT` (`--sender tests.e2e.grpc.outbox_app:producer`)."""

from __future__ import annotations

import os

from reliable import Producer


def producer() -> Producer:
    return Producer("grpc", endpoint=os.environ["OUTBOX_E2E_ENDPOINT"]).start()
