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
that waits goes on in a task from where it stopped (`resume`).
"""

from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

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
    task: asyncio.Task[T] = asyncio.get_running_loop().create_task(resume(work, waited))
    return await asyncio.shield(task)


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
