"""A wiring module as the README writes it for `reliable worker resend --sender
tests.e2e.grpc.resend_wiring:producer`: a module-level `Producer`, never started here.

`RESEND_WIRING_ENDPOINT` names a served broker (the production topology);
`RESEND_WIRING_STORE` instead makes it an embedded producer on that store directory."""

from __future__ import annotations

import os

from reliable import Producer

if os.environ.get("RESEND_WIRING_STORE"):
    producer = Producer("embedded", store_dir=os.environ["RESEND_WIRING_STORE"])
else:
    producer = Producer("grpc", endpoint=os.environ.get("RESEND_WIRING_ENDPOINT", "127.0.0.1:1"))
