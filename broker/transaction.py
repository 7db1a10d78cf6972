"""Transactional (half) messages: prepare, commit / rollback, and the check-back service.

    producer            broker                                   consumers
    send(TRAN_MSG) ---> RMQ_SYS_TRANS_HALF_TOPIC q0               (never see it: the half
                        REAL_TOPIC, REAL_QID, PGROUP,              topic is a system topic)
                        __transactionId__
    local transaction
    end(commit) ------> real message (sys flag COMMIT,   ------>  delivered
                        prepared tx offset = half offset)
                        op record {"h": half offset, "r": "commit"}
    end(rollback) ----> op record {"h": ..., "r": "rollback"}      nothing
    (no answer) <------ check service: a half older than the transaction timeout, not resolved,
                        is shown to the producer group's checker (at most `check_max` times,
                        one op record {"r": "check"} each); then rolled back

The half message is stored without transaction bits in its SYSFLAG so the dispatcher puts
it in the half topic's consume queue (that queue is the check service's to-do list); the
real topic's queue only ever receives the committed copy.

State survives a restart: it is entirely in the store. The op topic
(`RMQ_SYS_TRANS_OP_HALF_TOPIC` q0) is replayed from its committed offset; the committed
offsets of both system topics (group `CID_RMQ_SYS_TRANS`) advance together and are
persisted with consumerOffset.json. A check record's store time is its half message's last
check: replayed, the half waits for its next check time instead of being checked at once.
A slave holds the same records (replication copies the log), and a promoted slave replays
them before it checks anything (`Broker.promote`), so the check-back goes on where the old
master left it.

Commit writes the real message before the op record: a crash in between leaves the half
unresolved, and the next check finds the committed copy by its unique key (matching its
prepared tx offset) and records the commit without asking the producer or writing a second
copy.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from broker.errors import (
    ResponseCode,
    SendRejected,
    TransactionAlreadyResolved,
    TransactionError,
    TransactionNotFound,
)
from broker.store.message import Message, MessageExt, PutMessageResult, SysFlag
from broker.store.service import ServiceThread
from broker.store.store import MessageStore
from protocol.names import TRANS_HALF_TOPIC, TRANS_OP_HALF_TOPIC
from protocol.props import Prop

log = logging.getLogger(__name__)

TRANSACTION_GROUP = "CID_RMQ_SYS_TRANS"
PROP_TRANSACTION_ID = "__transactionId__"
COMMIT = "commit"
ROLLBACK = "rollback"
CHECK = "check"
_READ_BATCH = 64
_DISPATCH_WAIT_S = 5.0  # how long an end looks for a committed copy not dispatched yet
_HALF_ONLY = (Prop.REAL_TOPIC, Prop.REAL_QID, Prop.TRANSACTION_CHECK_TIMES, Prop.TRAN_MSG)

Checker = Callable[[MessageExt], None]


def look_checked(store: MessageStore, offset: object) -> MessageExt | None:
    """The record starting exactly at commitlog `offset`, CRC-checked; None for any offset
    a client made up (mid-record, past the end, cleaned away)."""
    if not isinstance(offset, int) or not (
        store.get_commitlog_min_offset() <= offset < store.get_commitlog_max_offset()
    ):
        return None
    try:
        msg = store.look_message_by_offset(offset)
        if msg is None or msg.commitlog_offset != offset:
            return None
        return store.look_message_by_msg_id(msg.offset_msg_id)
    except Exception:  # garbage decoded from the middle of a record
        return None


def transaction_id_of(msg: MessageExt) -> str:
    """The transaction id a checker must pass back to `end_transaction`."""
    return msg.properties.get(PROP_TRANSACTION_ID) or msg.msg_id


def build_half_message(msg: Message, producer_group: str) -> Message:
    props = dict(msg.properties)
    props[Prop.REAL_TOPIC] = msg.topic
    props[Prop.REAL_QID] = str(msg.queue_id)
    props[Prop.TRAN_MSG] = "true"
    props[Prop.PRODUCER_GROUP] = producer_group
    props.setdefault(PROP_TRANSACTION_ID, msg.unique_key or "")
    return Message(
        topic=TRANS_HALF_TOPIC,
        body=msg.body,
        queue_id=0,
        flag=msg.flag,
        properties=props,
        sys_flag=msg.sys_flag & ~int(SysFlag.TRANSACTION_ROLLBACK),
        born_timestamp=msg.born_timestamp,
        born_host=msg.born_host,
    )


def build_committed_message(half: MessageExt) -> Message:
    props = {k: v for k, v in half.properties.items() if k not in _HALF_ONLY}
    flag = (half.sys_flag & ~int(SysFlag.TRANSACTION_ROLLBACK)) | int(SysFlag.TRANSACTION_COMMIT)
    return Message(
        topic=half.properties[Prop.REAL_TOPIC],
        body=half.body,
        queue_id=int(half.properties.get(Prop.REAL_QID, "0")),
        flag=half.flag,
        properties=props,
        sys_flag=flag,
        born_timestamp=half.born_timestamp,
        born_host=half.born_host,
        prepared_tx_offset=half.commitlog_offset,
    )


class TransactionService(ServiceThread):
    """Half-message bookkeeping plus the periodic check-back (`do_check()` is one pass)."""

    name = "transaction-check-service"

    def __init__(
        self,
        store: MessageStore,
        clock: Callable[[], int],
        *,
        commit_offset: Callable[[str, str, int, int], None],
        query_offset: Callable[[str, str, int], int],
        timeout_ms: int,
        check_interval_ms: int,
        check_max: int,
        pass_interval_ms: int,
    ) -> None:
        super().__init__()
        self._store = store
        self._clock = clock
        self._commit_offset = commit_offset
        self._query_offset = query_offset
        self._timeout_ms = timeout_ms
        self._check_interval_ms = check_interval_ms
        self._check_max = check_max
        self._pass_interval_s = pass_interval_ms / 1000.0
        self._lock = threading.RLock()
        self._resolved: dict[int, str] = {}  # half queue offset -> commit/rollback
        self._checks: dict[int, int] = {}  # half queue offset -> checks so far
        # ms of the last check: set by each check, and from the op log's check records
        # (their store time) when it is replayed
        self._last_check: dict[int, int] = {}
        self._ops: list[tuple[int, int]] = []  # (op queue offset, half queue offset)
        self._half_progress = 0
        self._op_progress = 0
        self._checkers: dict[str, Checker] = {}
        self._executor: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ state
    def load(self) -> None:
        with self._lock:
            half = self._query_offset(TRANSACTION_GROUP, TRANS_HALF_TOPIC, 0)
            op = self._query_offset(TRANSACTION_GROUP, TRANS_OP_HALF_TOPIC, 0)
            self._half_progress = max(
                half, self._store.get_min_offset_in_queue(TRANS_HALF_TOPIC, 0)
            )
            self._op_progress = max(op, self._store.get_min_offset_in_queue(TRANS_OP_HALF_TOPIC, 0))
            self._resolved.clear()
            self._checks.clear()
            self._last_check.clear()
            self._ops.clear()
            offset = self._op_progress
            while True:
                result = self._store.get_messages(
                    TRANSACTION_GROUP, TRANS_OP_HALF_TOPIC, 0, offset, _READ_BATCH
                )
                for msg in result.messages:
                    self._apply_op(msg.queue_offset, json.loads(msg.body), msg.store_timestamp)
                    offset = msg.queue_offset + 1
                if not result.messages:
                    break
            self._advance()

    def _apply_op(self, op_offset: int, op: dict[str, object], at_ms: int | None = None) -> None:
        """Take one op record; `at_ms`: when it was stored (a replayed check's time, so
        the half message waits for its next check time after a restart or a promotion)."""
        half = int(str(op["h"]))
        kind = str(op["r"])
        self._ops.append((op_offset, half))
        if half < self._half_progress:
            return  # settled before the progress mark: nothing to remember
        if kind == CHECK:
            self._checks[half] = int(str(op.get("n", 1)))
            if at_ms is not None:
                self._last_check[half] = max(self._last_check.get(half, 0), at_ms)
        else:
            self._resolved.setdefault(half, kind)

    def _advance(self) -> None:
        while self._half_progress in self._resolved:
            self._resolved.pop(self._half_progress)
            self._checks.pop(self._half_progress, None)
            self._last_check.pop(self._half_progress, None)
            self._half_progress += 1
        while self._ops and self._ops[0][1] < self._half_progress:
            self._op_progress = self._ops.pop(0)[0] + 1
        self._commit_offset(TRANSACTION_GROUP, TRANS_HALF_TOPIC, 0, self._half_progress)
        self._commit_offset(TRANSACTION_GROUP, TRANS_OP_HALF_TOPIC, 0, self._op_progress)

    def _write_op(self, half_offset: int, kind: str, checks: int = 0) -> None:
        body: dict[str, object] = {"h": half_offset, "r": kind}
        if kind == CHECK:
            body["n"] = checks
        result = self._store.put_message(
            Message(
                topic=TRANS_OP_HALF_TOPIC,
                body=json.dumps(body).encode(),
                queue_id=0,
                properties={Prop.TAGS: "d"},
            )
        )
        if not result.status.stored or result.append is None:
            raise SendRejected(
                TRANS_OP_HALF_TOPIC, result.status.value, ResponseCode.SERVICE_NOT_AVAILABLE
            )
        self._apply_op(result.append.queue_offset, body)
        self._advance()

    def resolution(self, half_queue_offset: int) -> str | None:
        """commit / rollback / None (unknown or pending) for a half message."""
        with self._lock:
            if half_queue_offset < self._half_progress:
                return "resolved"
            return self._resolved.get(half_queue_offset)

    # ------------------------------------------------------------------ produce side
    def prepare(self, msg: Message, producer_group: str) -> PutMessageResult:
        return self._store.put_message(build_half_message(msg, producer_group))

    def end(
        self, producer_group: str, transaction_id: str, commitlog_offset: int, commit: bool
    ) -> None:
        with self._lock:
            half = look_checked(self._store, commitlog_offset)
            if half is None or half.topic != TRANS_HALF_TOPIC:
                raise TransactionNotFound(
                    transaction_id, commitlog_offset, "no half message at that offset"
                )
            if transaction_id not in (transaction_id_of(half), half.offset_msg_id, half.unique_key):
                raise TransactionNotFound(
                    transaction_id,
                    commitlog_offset,
                    "the half message there has another transaction id",
                )
            if half.properties.get(Prop.PRODUCER_GROUP) != producer_group:
                raise TransactionNotFound(
                    transaction_id,
                    commitlog_offset,
                    f"the half message belongs to producer group "
                    f"{half.properties.get(Prop.PRODUCER_GROUP)!r}",
                )
            wanted = COMMIT if commit else ROLLBACK
            done = self.resolution(half.queue_offset)
            if done == "resolved":  # settled long ago: its op record left memory
                if not half.unique_key:
                    return
                done = COMMIT if self._committed_copy_dispatched(half) else ROLLBACK
            if done is not None:
                if done != wanted:
                    raise TransactionAlreadyResolved(transaction_id, done + "ed")
                return
            if commit:
                self._put_real(half)
            self._write_op(half.queue_offset, wanted)

    def _put_real(self, half: MessageExt) -> None:
        result = self._store.put_message(build_committed_message(half))
        if not result.status.stored:
            raise SendRejected(
                half.properties[Prop.REAL_TOPIC], result.status.value, ResponseCode.SYSTEM_ERROR
            )

    # ------------------------------------------------------------------ check-back
    def register_checker(self, producer_group: str, checker: Checker) -> None:
        with self._lock:
            self._checkers[producer_group] = checker

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="tx-check")
        super().start()

    def shutdown(self, timeout: float = 10.0) -> None:
        super().shutdown(timeout)
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            self._executor = None

    def run(self) -> None:
        while not self.stopped:
            try:
                self.do_check()
            except Exception:
                log.exception("transaction check pass failed")
            self.wait_for_running(self._pass_interval_s)

    def do_check(self) -> int:
        """One pass over the unresolved half messages; returns how many checks were sent."""
        sent = 0
        calls: list[tuple[Checker, MessageExt]] = []
        with self._lock:
            now = self._clock()
            offset = self._half_progress
            while True:
                result = self._store.get_messages(
                    TRANSACTION_GROUP, TRANS_HALF_TOPIC, 0, offset, _READ_BATCH
                )
                if not result.messages:
                    break
                young = False
                for half in result.messages:
                    offset = half.queue_offset + 1
                    if half.queue_offset in self._resolved:
                        continue
                    if now - half.store_timestamp < self._timeout_ms:
                        young = True  # the queue is in store-time order: the rest are younger
                        break
                    call = self._check_one(half, now)
                    if call is not None:
                        calls.append(call)
                if young:
                    break
        for checker, shown in calls:
            sent += 1
            if self._executor is not None:
                self._executor.submit(self._call_checker, checker, shown)
            else:
                self._call_checker(checker, shown)
        return sent

    def _check_one(self, half: MessageExt, now: int) -> tuple[Checker, MessageExt] | None:
        qoff = half.queue_offset
        last = self._last_check.get(qoff)
        if last is not None and now - last < self._check_interval_ms:
            return None
        real_topic = half.properties.get(Prop.REAL_TOPIC, "")
        if self._committed_copy_exists(half, real_topic):
            self._write_op(qoff, COMMIT)
            return None
        checks = self._checks.get(qoff, 0)
        if checks >= self._check_max:
            log.warning(
                "transaction %s (producer group %s) unresolved after %d checks; rolled back",
                transaction_id_of(half),
                half.properties.get(Prop.PRODUCER_GROUP),
                checks,
            )
            self._write_op(qoff, ROLLBACK)
            return None
        checker = self._checkers.get(half.properties.get(Prop.PRODUCER_GROUP, ""))
        if checker is None:
            return None  # nobody to ask yet; not counted
        self._write_op(qoff, CHECK, checks + 1)
        self._last_check[qoff] = now
        shown = replace(
            half,
            topic=real_topic,
            queue_id=int(half.properties.get(Prop.REAL_QID, "0")),
            properties={**half.properties, Prop.TRANSACTION_CHECK_TIMES: str(checks + 1)},
        )
        return checker, shown

    def _committed_copy_dispatched(self, half: MessageExt) -> bool:
        """Whether a transaction settled long ago was committed. Its committed copy is found
        through the unique-key index, which the dispatcher fills after the append: a copy put
        a moment ago (the same commit sent again at once) may not be indexed yet, so a miss
        waits for the dispatch of everything appended so far and looks once more."""
        real_topic = half.properties.get(Prop.REAL_TOPIC, "")
        if self._committed_copy_exists(half, real_topic):
            return True
        if not self._store.wait_dispatched(_DISPATCH_WAIT_S):
            raise TransactionError(
                f"transaction {transaction_id_of(half)!r}: its outcome is not indexed yet "
                f"(dispatch is {_DISPATCH_WAIT_S:g} s behind); end it again later"
            )
        return self._committed_copy_exists(half, real_topic)

    def _committed_copy_exists(self, half: MessageExt, real_topic: str) -> bool:
        key = half.unique_key
        if not key or not real_topic:
            return False
        found = self._store.query_message_by_unique_key(real_topic, key)
        return found is not None and found.prepared_tx_offset == half.commitlog_offset

    @staticmethod
    def _call_checker(checker: Checker, msg: MessageExt) -> None:
        try:
            checker(msg)
        except Exception:
            log.exception("transaction checker failed for %s", transaction_id_of(msg))
