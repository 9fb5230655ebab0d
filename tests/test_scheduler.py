from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kokoro_contract.speed import SpeedModel
from model_server.engines.base import CancelToken
from model_server.errors import SynthesisCancelled
from model_server.scheduler import DeadlineSlots, FairSlots, Scheduler


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


async def test_deadline_slots_grant_the_earliest_deadline_first() -> None:
    slots = DeadlineSlots(1)
    await slots.acquire("holder")
    order: list[str] = []

    async def take(key: str, deadline: float) -> None:
        await slots.acquire(key, deadline)
        order.append(key)
        slots.release()

    # a reply's later chunks (with slack) were queued before a new reply's first chunk
    tasks = [
        asyncio.create_task(take("later-2", 12.0)),
        asyncio.create_task(take("later-1", 10.0)),
        asyncio.create_task(take("new-first", 1.0)),
        asyncio.create_task(take("tie-b", 10.0)),  # same deadline as later-1: arrival order
    ]
    await asyncio.sleep(0)  # one turn of the loop: every task reaches its acquire()
    assert [w.key for w in slots.waiters()] == ["new-first", "later-1", "tie-b", "later-2"]
    slots.release()
    await asyncio.gather(*tasks)
    assert order == ["new-first", "later-1", "tie-b", "later-2"]
    assert slots.busy == 0


async def test_a_cancelled_deadline_waiter_leaves_the_queue() -> None:
    slots = DeadlineSlots(1)
    await slots.acquire("x")
    waiting = [asyncio.create_task(slots.acquire(k, d)) for k, d in (("a", 1.0), ("b", 2.0))]
    await asyncio.sleep(0)
    waiting[0].cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting[0]
    assert [w.key for w in slots.waiters()] == ["b"]
    slots.release()
    await waiting[1]
    slots.release()
    assert slots.busy == 0


async def test_load_reports_the_backlog_and_the_tightest_slack() -> None:
    speed = SpeedModel(prior_a=0.5, prior_b=0.0)  # every call: 0.5 s
    scheduler = Scheduler(workers=1, speed=speed)
    gate = threading.Event()
    entered = threading.Event()

    def held(token: CancelToken) -> str:
        entered.set()
        gate.wait(timeout=30)
        return "done"

    now = time.perf_counter()
    running = asyncio.create_task(scheduler.run("a", held, phonemes=10))
    await asyncio.to_thread(entered.wait, 30)
    queued = [
        asyncio.create_task(
            scheduler.run("b", lambda t: "b", phonemes=10, deadline=now + 1000, explicit=True)
        ),
        asyncio.create_task(
            scheduler.run("c", lambda t: "c", phonemes=10, deadline=now - 1, explicit=True)
        ),
    ]
    await asyncio.sleep(0)
    load = scheduler.load()
    assert (load.workers, load.busy, load.waiting) == (1, 1, 2)
    assert 0.5 < load.backlog_s <= 1.5  # two queued calls plus what is left of the running one
    # c goes next (EDF); its deadline has passed: negative slack
    assert [w.key for w in scheduler.slots.waiters()] == ["c", "b"]
    assert load.min_slack_s is not None
    assert load.min_slack_s < -1
    gate.set()
    assert await running == "done"
    assert sorted(await asyncio.gather(*queued)) == ["b", "c"]
    assert scheduler.load().deadline_misses == 1  # c, not b
    assert scheduler.load().backlog_s == 0
    scheduler.close()


def test_the_speed_model_learns_the_line_from_what_it_sees() -> None:
    speed = SpeedModel(prior_a=0.35, prior_b=0.028)
    assert speed.estimate(100) == pytest.approx(3.15)
    for _ in range(60):  # a machine twice as fast as the prior
        for n in (10, 50, 150):
            speed.observe(n, 0.2 + 0.014 * n)
    a, b = speed.line
    assert a == pytest.approx(0.2, abs=0.01)
    assert b == pytest.approx(0.014, abs=0.0005)


@pytest.mark.parametrize("scheduling", ["edf", "fair"])
def test_both_policies_are_selectable(scheduling: str) -> None:
    scheduler = Scheduler(workers=2, scheduling=scheduling)
    expected = DeadlineSlots if scheduling == "edf" else FairSlots
    assert isinstance(scheduler.slots, expected)
    scheduler.close()
    with pytest.raises(ValueError, match="scheduling must be one of edf, fair"):
        Scheduler(workers=1, scheduling="lifo")
