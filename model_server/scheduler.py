"""One scheduler for every session: a bounded pool of engine workers, granted round-robin.

Work is granted one segment at a time, in turns across sessions: a session with ten queued
segments does not hold back a session with one. No lock is held for a whole session. A waiter
that is cancelled (its client left, or its request was cancelled) leaves the queue at once; a
segment already running is aborted through its `CancelToken`, and its worker slot is freed only
when the worker thread has really stopped, so the pool is never oversubscribed.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from model_server.engines.base import CancelToken

T = TypeVar("T")


class FairSlots:
    """`slots` permits handed out round-robin by key (one key per session)."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.slots = slots
        self._free = slots
        self._waiting: OrderedDict[Hashable, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def busy(self) -> int:
        return self.slots - self._free

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    async def acquire(self, key: Hashable) -> None:
        if self._free and not self._waiting:
            self._free -= 1
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, deque()).append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # granted just as we were cancelled: pass it on
            else:
                self._forget(key, fut)
            raise

    def release(self) -> None:
        while self._waiting:
            key, queue = next(iter(self._waiting.items()))
            fut = queue.popleft()
            if queue:
                self._waiting.move_to_end(key)  # the next turn goes to another session
            else:
                del self._waiting[key]
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1

    def _forget(self, key: Hashable, fut: asyncio.Future[None]) -> None:
        queue = self._waiting.get(key)
        if queue is None:
            return
        try:
            queue.remove(fut)
        except ValueError:
            return
        if not queue:
            del self._waiting[key]


class Scheduler:
    """Runs blocking engine calls on `workers` threads, fairly across keys."""

    def __init__(self, workers: int) -> None:
        self.slots = FairSlots(workers)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="engine")

    async def run(self, key: Hashable, fn: Callable[[CancelToken], T]) -> T:
        await self.slots.acquire(key)
        token = CancelToken()
        try:
            future = asyncio.get_running_loop().run_in_executor(self._pool, fn, token)
            try:
                return await asyncio.shield(future)
            except asyncio.CancelledError:
                token.cancel()  # abort the running call, then wait for the thread to stop
                await asyncio.wait([future])
                raise
        finally:
            self.slots.release()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
