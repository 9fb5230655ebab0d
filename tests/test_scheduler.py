from __future__ import annotations

import asyncio
import threading

import pytest

from model_server.engines.base import CancelToken
from model_server.errors import SynthesisCancelled
from model_server.scheduler import FairSlots, Scheduler


async def test_slots_are_granted_round_robin_across_keys() -> None:
    slots = FairSlots(1)
    await slots.acquire("holder")
    order: list[str] = []

    async def take(key: str, label: str) -> None:
        await slots.acquire(key)
        order.append(label)
        slots.release()

    # session A queues three segments before B and C queue one each
    tasks = [asyncio.create_task(take("A", f"A{i}")) for i in range(3)]
    tasks += [asyncio.create_task(take("B", "B0")), asyncio.create_task(take("C", "C0"))]
    await asyncio.sleep(0)  # one turn of the loop: every task reaches its acquire()
    assert slots.waiting == 5
    slots.release()
    await asyncio.gather(*tasks)
    assert order == ["A0", "B0", "C0", "A1", "A2"]
    assert slots.busy == 0


async def test_cancelled_waiter_leaves_the_queue() -> None:
    slots = FairSlots(1)
    await slots.acquire("x")
    waiter = asyncio.create_task(slots.acquire("y"))
    await asyncio.sleep(0)
    assert slots.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert slots.waiting == 0
    slots.release()
    assert slots.busy == 0


async def test_a_grant_to_a_cancelled_waiter_is_passed_on() -> None:
    slots = FairSlots(1)
    await slots.acquire("x")
    first = asyncio.create_task(slots.acquire("y"))
    second = asyncio.create_task(slots.acquire("z"))
    await asyncio.sleep(0)
    assert slots.waiting == 2
    slots.release()  # grants `first`...
    first.cancel()  # ...which is cancelled before it runs: the slot must reach `second`
    with pytest.raises(asyncio.CancelledError):
        await first
    await second
    assert slots.busy == 1
    slots.release()
    assert slots.busy == 0


async def test_cancelling_a_run_aborts_the_call_and_frees_the_slot_after_it_stops() -> None:
    scheduler = Scheduler(workers=1)
    entered = threading.Event()
    stopped = threading.Event()

    def blocking(token: CancelToken) -> str:
        aborted = threading.Event()
        token.on_cancel(aborted.set)
        entered.set()
        aborted.wait(timeout=30)
        stopped.set()
        raise SynthesisCancelled()

    task = asyncio.create_task(scheduler.run("k", blocking))
    await asyncio.to_thread(entered.wait, 30)
    assert scheduler.slots.busy == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stopped.is_set()  # the slot was held until the thread had really stopped
    assert scheduler.slots.busy == 0
    assert await scheduler.run("k", lambda token: "next") == "next"
    scheduler.close()


def test_cancel_token_runs_late_callbacks_at_once() -> None:
    token = CancelToken()
    seen: list[str] = []
    token.on_cancel(lambda: seen.append("early"))
    token.cancel()
    token.cancel()
    token.on_cancel(lambda: seen.append("late"))
    assert seen == ["early", "late"]
    assert token.cancelled
