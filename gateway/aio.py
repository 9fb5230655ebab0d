"""asyncio helpers."""

from __future__ import annotations

import asyncio
import enum
from collections import deque
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


class Poked(enum.Enum):
    POKED = "poked"


POKED = Poked.POKED  # what `Inbox.get` answers for a poke


class Inbox[T]:
    """A bounded queue beside one flag: `put` waits while `maxsize` items wait; `poke()` (from
    a callback, never waiting) asks the reader to look again. A poke never takes an item's
    place and is never lost: the next `get` answers `POKED` before the items waiting (once,
    however often it was poked since). One reader; a `get` cancelled while it waits takes
    nothing."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._items: deque[T] = deque()
        self._poked = False
        self._readable = asyncio.Event()  # an item or a poke waits
        self._room = asyncio.Event()  # fewer than `maxsize` items wait
        self._room.set()

    def qsize(self) -> int:
        return len(self._items)

    def full(self) -> bool:
        return len(self._items) >= self.maxsize

    async def put(self, item: T) -> None:
        while self.full():
            self._room.clear()
            await self._room.wait()
        self._items.append(item)
        self._readable.set()

    def poke(self) -> None:
        self._poked = True
        self._readable.set()

    async def get(self) -> T | Poked:
        while True:
            if self._poked:
                self._poked = False
                return POKED
            if self._items:
                item = self._items.popleft()
                self._room.set()
                return item
            self._readable.clear()
            await self._readable.wait()


def first_leaf(group: BaseExceptionGroup[Any]) -> BaseException:
    """The first exception of a group that is not itself a group (task groups nest)."""
    first = group.exceptions[0]
    return first_leaf(first) if isinstance(first, BaseExceptionGroup) else first
