from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kokoro_contract.speed import SpeedModel
from model_server.config import Settings
from model_server.engines.base import CancelToken
from model_server.errors import SynthesisCancelled
from model_server.scheduler import DeadlineSlots, FairSlots, Scheduler, Tally
from model_server.service import ModelService
from tests.support.fakes import FakeEngine, identity_g2p


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


def test_a_machine_far_faster_than_the_prior_is_known_after_one_call() -> None:
    """A GPU: 25 times the prior's speed. The prior gives the line's shape until the sizes seen
    spread enough for a line of their own; it does not weigh on the slope from sizes no call
    had (a prior counted as observations at 200 phonemes kept these estimates 20x too high
    for dozens of calls)."""
    speed = SpeedModel(prior_a=0.35, prior_b=0.028)  # 1.47 s for 40 phonemes
    speed.observe(40, 0.042)  # the truth: 0.03 s + 0.3 ms per phoneme
    assert speed.estimate(40) == pytest.approx(0.042)
    assert speed.estimate(200) == pytest.approx((0.35 + 0.028 * 200) * 0.042 / 1.47)
    for n in (42, 38, 41):  # all alike: still the prior's shape, at the speed seen
        speed.observe(n, 0.03 + 0.0003 * n)
    a, b = speed.line
    assert b / a == pytest.approx(0.028 / 0.35)
    for n in (20, 60, 30, 50):  # spread out: their own line
        speed.observe(n, 0.03 + 0.0003 * n)
    assert speed.line == pytest.approx((0.03, 0.0003), rel=0.05)
    assert speed.estimate(200) == pytest.approx(0.09, rel=0.05)


def test_noise_on_a_flat_line_keeps_both_terms_non_negative() -> None:
    speed = SpeedModel()
    for n, t in ((10, 0.05), (50, 0.04), (90, 0.03), (10, 0.05), (90, 0.03)):
        speed.observe(n, t)
    a, b = speed.line
    assert b == 0.0
    assert a == pytest.approx(0.04, abs=0.005)
    through_origin = SpeedModel()
    for n, t in ((10, 0.001), (100, 0.5), (10, 0.001), (100, 0.5)):
        through_origin.observe(n, t)
    a, b = through_origin.line
    assert a == 0.0
    assert b > 0


def test_forget_speed_goes_back_to_the_priors() -> None:
    scheduler = Scheduler(workers=2)
    scheduler.speed.observe(40, 0.01)
    scheduler.shared_speed.observe(40, 0.02)
    scheduler.forget_speed()
    assert (scheduler.speed.calls, scheduler.shared_speed.calls) == (0, 0)
    assert scheduler.speed.line == (0.35, 0.028)
    assert scheduler.shared_speed.line == (0.5, 0.045)
    scheduler.close()


async def test_the_speed_is_learned_from_the_second_warm_up_call() -> None:
    """The first call pays for what the engine sets up once (a GPU's kernels): not learned."""
    engine = FakeEngine()
    service = ModelService(
        Settings(workers=1, warmup=True), lambda _: engine, g2p_factory=identity_g2p
    )
    await service.load()
    scheduler = service.get().synthesizer.scheduler
    assert engine.calls == ["Hello there.", "Hello there."]
    assert scheduler.speed.calls == 1
    service.close()


@pytest.mark.parametrize("scheduling", ["edf", "fair"])
def test_both_policies_are_selectable(scheduling: str) -> None:
    scheduler = Scheduler(workers=2, scheduling=scheduling)
    expected = DeadlineSlots if scheduling == "edf" else FairSlots
    assert isinstance(scheduler.slots, expected)
    scheduler.close()
    with pytest.raises(ValueError, match="scheduling must be one of edf, fair"):
        Scheduler(workers=1, scheduling="lifo")


def test_the_real_time_capacity_is_counted_in_batches_when_the_engine_batches() -> None:
    """4 workers, a 60-phoneme segment in 0.78 s for 3.9 s of speech (0.2 s a second of it):
    20 replies at once unbatched; with batched decoder steps whose rows cost an eighth of alone
    at 16 (`kokoro_contract.capacity`), as many as the one decoder thread keeps up with, 50."""
    scheduler = Scheduler(workers=4, speed=SpeedModel(prior_a=0.0, prior_b=0.013))
    scheduler.shared_speed = SpeedModel(prior_a=0.0, prior_b=0.013)
    assert scheduler.load().realtime_streams == pytest.approx(20.0)
    scheduler.batch_curve = lambda: {"1": 0.004, "2": 0.0044, "16": 0.008}
    load = scheduler.load()
    assert load.realtime_streams == pytest.approx(50.0)
    assert load.batch_curve == {"1": 0.004, "2": 0.0044, "16": 0.008}
    scheduler.close()


async def test_a_call_is_learned_by_its_own_compute_less_what_a_batch_credited() -> None:
    """A decoder step that ran in a batch: 1.0 s of the call, 0.6 s of it the other rows'
    (`CancelToken.credit_s`): the segment's tally counts 0.4 s, its own step alone; when the
    window's audio was ready is still the whole second."""
    scheduler = Scheduler(workers=1)
    now = [10.0]
    scheduler.clock = lambda: now[0]

    def batched(token: CancelToken) -> str:
        now[0] += 1.0
        token.credit_s += 0.6
        return "audio"

    tally = Tally()
    before = scheduler.window_speed.estimate(16)
    assert await scheduler.run("a", batched, frames=16, tally=tally) == "audio"
    assert tally.seconds == pytest.approx(0.4)
    assert scheduler.window_speed.estimate(16) > before  # learned from the whole 1.0 s
    scheduler.close()
