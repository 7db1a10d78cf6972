"""A call gRPC itself failed becomes the client's typed error: the server's limit on calls
or streams (`RESOURCE_EXHAUSTED`) is flow control, retried after a back-off like the
protocol's `TOO_MANY_REQUESTS`, never a transport failure tried again at once."""

from __future__ import annotations

import grpc
import pytest

from reliable.errors import BrokerBusy, FailureKind, TransportError
from reliable.transport._grpc_convert import call_failure


class _Failed(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "what the server said"


def test_resource_exhausted_is_flow_control() -> None:
    err = call_failure("SendMessage", "127.0.0.1:8081", _Failed(grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert isinstance(err, BrokerBusy)
    assert err.kind is FailureKind.FLOW_CONTROL and err.code == "RESOURCE_EXHAUSTED"
    assert "SendMessage to 127.0.0.1:8081" in str(err)


@pytest.mark.parametrize(
    "code",
    [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED],
)
def test_other_codes_are_transport_failures(code: grpc.StatusCode) -> None:
    err = call_failure("ReceiveMessage", "h:1", _Failed(code))
    assert type(err) is TransportError and code.name in str(err)
