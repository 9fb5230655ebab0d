"""asyncio helpers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

# a clock in seconds; only differences between its readings mean anything
Clock = Callable[[], float]


def loop_time() -> float:
    """The running event loop's clock: the one asyncio's timeouts and the reply plans read."""
    return asyncio.get_running_loop().time()


async def cancel_and_wait(task: asyncio.Task[Any]) -> None:
    """Cancel `task` and wait until it has finished; our own cancellation still propagates.

    "Our own" means a cancel request that arrived while waiting: a task can carry a pending
    count from earlier (a TaskGroup that cancelled it when a child failed), and the task's
    CancelledError must not be taken for ours then."""
    current = asyncio.current_task()
    before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        # not `await task`: a waiter that is itself cancelled passes the cancel on to what it
        # awaits, and AnyIO (sse-starlette's response scope) cancels its tasks again on every
        # turn of the loop, which would break off the task's own cleanup half way
        await asyncio.wait([task])
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > before:
            raise
    if not task.cancelled():
        task.result()  # its exception, if it ended with one


def first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first exception of a group that is not itself a group (task groups nest)."""
    first = group.exceptions[0]
    return first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
