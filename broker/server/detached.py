"""Coroutines started in their caller's turn, and work that outlives a cancelled caller.

    response = await detached(store_and_answer(...))   # runs to its end, whatever the call

A unary call is cancelled when its client gives up on it (a deadline passed, a connection
closed). What it was doing may be half done: a send appended to the commitlog and waiting
for its fsync is stored whether or not anyone waits for the answer, so its result must
still reach the de-duplication cache, or the client's retry of the same message would be
stored a second time. `detached` runs such work so that cancelling the caller cancels only
the caller's wait, never the work.

Both helpers start the coroutine at once, in the caller's loop turn: work that never waits
(most sends under `--flush async`) finishes there, with no task and no extra turn; work
that waits goes on from where it stopped: `detached` drives it from the done-callbacks of
what it awaits (`_Drive`: no task, no shield; a send stored with the others of a busy
turn waits once, on its group's future), `resume` in a task.
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


async def detached(work: Coroutine[Any, Any, T]) -> T:
    """`await work`, except that cancelling the caller leaves `work` running to its end
    (its own `finally` then settles what it must); the caller gets CancelledError."""
    try:
        waited = work.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    except BaseException:
        work.close()
        raise
    loop = asyncio.get_running_loop()
    outcome: asyncio.Future[T] = loop.create_future()
    _Drive(work, outcome, loop).wait_on(waited)
    # cancelling the caller cancels `outcome` alone: `work` goes on, its outcome unread
    return await outcome


class _Drive(Generic[T]):
    """Drives a started coroutine to its end without a task: each future it awaits resumes
    it from its done-callback (a bare yield, from the next loop turn), as a task's step
    would; its outcome goes to `result` unless the caller has gone (`result` cancelled).
    The coroutine runs outside any task (`asyncio.current_task()` is None in it)."""

    __slots__ = ("loop", "result", "work")

    def __init__(
        self,
        work: Coroutine[Any, Any, T],
        result: asyncio.Future[T],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.work = work
        self.result = result
        self.loop = loop

    def wait_on(self, waited: Any) -> None:
        if waited is None:  # a bare yield (`asyncio.sleep(0)`): on in the next turn
            self.loop.call_soon(self.step, None)
            return
        if not getattr(waited, "_asyncio_future_blocking", False):  # a bug: fail its caller
            self.work.close()
            if not self.result.done():
                self.result.set_exception(RuntimeError(f"detached work yielded {waited!r}"))
            return
        waited._asyncio_future_blocking = False  # taken, as a task takes it
        waited.add_done_callback(self.step)

    def step(self, _done: object) -> None:
        result = self.result
        try:
            waited = self.work.send(None)  # the awaited future's `__await__` reads it
        except StopIteration as done:
            if not result.done():
                result.set_result(done.value)
            return
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # its own cancellation included
            if not result.done():
                result.set_exception(exc)
            return
        self.wait_on(waited)


@types.coroutine
def resume(call: Coroutine[Any, Any, T], waited: Any) -> Generator[Any, Any, T]:
    """Drive `call`, started and now suspended on `waited` (what it yielded: the future it
    awaits, or None for a bare turn), to its end: what the task running this sends or
    throws in goes on to `call`, as `await` would have passed it (cancellation included)."""
    while True:
        try:
            sent = yield waited
        except GeneratorExit:  # closed unfinished (its loop went away): close the call too
            call.close()
            raise
        except BaseException as exc:  # cancellation included
            try:
                waited = call.throw(exc)
            except StopIteration as done:
                result: T = done.value
                return result
        else:
            try:
                waited = call.send(sent)
            except StopIteration as done:
                result = done.value
                return result
