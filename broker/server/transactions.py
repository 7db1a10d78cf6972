"""Transaction ids on the wire, and the orphaned-transaction check command.

The id the client gets back for a half message is `<offset message id>:<broker transaction
id>`: the offset message id (store host + commitlog offset) finds the half message again
without server-side state, so commits and checks work across restarts.
"""

from __future__ import annotations

from broker.server import convert
from broker.server.errors import InvalidTransactionId
from broker.server.status import ok
from broker.store.message import MessageExt, decode_offset_msg_id, encode_offset_msg_id
from protocol.pb import service_pb2
from protocol.props import Prop

TXN_SEPARATOR = ":"
TRANSACTION_ID_PROPERTY = "__transactionId__"


def encode_transaction_id(offset_msg_id: str, broker_txn_id: str) -> str:
    return f"{offset_msg_id}{TXN_SEPARATOR}{broker_txn_id}"


def decode_transaction_id(transaction_id: str) -> tuple[int, str]:
    """(commitlog offset, broker transaction id), or InvalidTransactionId."""
    offset_id, sep, broker_txn_id = transaction_id.partition(TXN_SEPARATOR)
    if not sep or not broker_txn_id:
        raise InvalidTransactionId(f"transaction id {transaction_id[:80]!r} is not ours")
    try:
        _, offset = decode_offset_msg_id(offset_id)
    except ValueError:
        raise InvalidTransactionId(f"transaction id {transaction_id[:80]!r} is malformed") from None
    return offset, broker_txn_id


def orphan_command(ext: MessageExt) -> service_pb2.TelemetryCommand:
    """The telemetry command asking a producer to resolve one half message."""
    topic = ext.properties.get(Prop.REAL_TOPIC) or ext.topic
    command = service_pb2.TelemetryCommand()
    command.status.CopyFrom(ok())
    check = command.recover_orphaned_transaction_command
    check.message.CopyFrom(
        convert.to_proto(ext, topic=topic, namespace="", receipt_handle=None, delivery_attempt=0)
    )
    broker_txn_id = ext.properties.get(TRANSACTION_ID_PROPERTY) or ext.msg_id
    check.transaction_id = encode_transaction_id(
        encode_offset_msg_id(ext.store_host, ext.commitlog_offset), broker_txn_id
    )
    return command
