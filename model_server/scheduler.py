"""One scheduler for every session: a bounded pool of engine workers, granted one engine call at
a time, by deadline.

Every engine call (one segment; with progressive synthesis, one step of it) waits for a worker
slot. With `edf` (the default) the waiting segment whose audio is needed first goes next: a new
reply's first chunk goes ahead of later chunks that still have slack. With `fair`, the slots go
round-robin by session (the policy before deadlines), so a session with ten queued segments does
not hold back one with one.

With progressive synthesis a segment is several steps, each granted a slot on its own: its
front pass, then each window of its decoder (`synthesis.py`, `windows.py`). Each window has its
own deadline (when the listener will have played the audio before it), so a new reply's first
window goes ahead of another reply's later windows, and a cancel takes effect at the next step
at the latest. The speed learned per segment (`GET /load`) is still per segment: its steps'
compute summed (`Tally`, `observe_segment`); the decoder's speed per frame is learned apart
(`window_speed`), for the window schedule.

No lock is held for a whole session. A waiter that is cancelled (its client left, or its
request was cancelled) leaves the queue at once; a segment already running is aborted through
its `CancelToken`, and its worker slot is freed only when the worker thread has really stopped,
so the pool is never oversubscribed. The scheduler also keeps what admission control needs: the
backlog in seconds of compute (from the learned speed of the engine), and deadline misses.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from kokoro_contract import capacity
from kokoro_contract.load import (
    FIRST_CHUNK_PHONEMES,
    SEGMENT_PHONEMES,
    SPEECH_S_PER_PHONEME,
    LoadReport,
)
from kokoro_contract.speed import PRIOR_SECONDS_PER_CALL, PRIOR_SECONDS_PER_PHONEME, SpeedModel
from model_server.engines.base import CancelToken

log = logging.getLogger(__name__)
T = TypeVar("T")
SCHEDULING = ("edf", "fair")


@dataclass(order=True)
class Waiter:
    deadline: float  # perf_counter seconds by which the segment's audio is needed
    seq: int
    key: Hashable = field(compare=False)
    cost_s: float = field(compare=False)  # estimated compute
    future: asyncio.Future[None] = field(compare=False)


class Slots(Protocol):
    slots: int

    @property
    def busy(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    def waiters(self) -> list[Waiter]: ...

    async def acquire(
        self, key: Hashable, deadline: float | None = None, cost_s: float = 0.0
    ) -> None: ...

    def release(self) -> None: ...


class _SlotsBase:
    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("slots must be >= 1")
        self.slots = slots
        self._free = slots
        self._seq = itertools.count()

    @property
    def busy(self) -> int:
        return self.slots - self._free

    @property
    def waiting(self) -> int:
        raise NotImplementedError

    async def acquire(
        self, key: Hashable, deadline: float | None = None, cost_s: float = 0.0
    ) -> None:
        """A slot for `key`, whose work is needed by `deadline` (perf_counter seconds; default
        now) and takes about `cost_s` of compute."""
        if self._free and not self.waiting:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        when = time.perf_counter() if deadline is None else deadline
        waiter = Waiter(when, next(self._seq), key, cost_s, future)
        self._enqueue(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled():
                self.release()  # granted just as we were cancelled: pass it on
            else:
                self._forget(waiter)
            raise

    def release(self) -> None:
        while (waiter := self._next()) is not None:
            if not waiter.future.done():
                waiter.future.set_result(None)
                return
        self._free += 1

    def waiters(self) -> list[Waiter]:
        raise NotImplementedError

    def _enqueue(self, waiter: Waiter) -> None:
        raise NotImplementedError

    def _next(self) -> Waiter | None:
        raise NotImplementedError

    def _forget(self, waiter: Waiter) -> None:
        raise NotImplementedError


class DeadlineSlots(_SlotsBase):
    """Earliest deadline first; ties in arrival order."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self._heap: list[Waiter] = []

    @property
    def waiting(self) -> int:
        return len(self._heap)

    def waiters(self) -> list[Waiter]:
        return sorted(self._heap)

    def _enqueue(self, waiter: Waiter) -> None:
        heapq.heappush(self._heap, waiter)

    def _next(self) -> Waiter | None:
        return heapq.heappop(self._heap) if self._heap else None

    def _forget(self, waiter: Waiter) -> None:
        if waiter in self._heap:
            self._heap.remove(waiter)
            heapq.heapify(self._heap)


class FairSlots(_SlotsBase):
    """Round-robin by key (one key per session), in arrival order within a key."""

    def __init__(self, slots: int) -> None:
        super().__init__(slots)
        self._waiting: OrderedDict[Hashable, deque[Waiter]] = OrderedDict()

    @property
    def waiting(self) -> int:
        return sum(len(queue) for queue in self._waiting.values())

    def waiters(self) -> list[Waiter]:
        return [w for queue in self._waiting.values() for w in queue]

    def _enqueue(self, waiter: Waiter) -> None:
        self._waiting.setdefault(waiter.key, deque()).append(waiter)

    def _next(self) -> Waiter | None:
        if not self._waiting:
            return None
        key, queue = next(iter(self._waiting.items()))
        waiter = queue.popleft()
        if queue:
            self._waiting.move_to_end(key)  # the next turn goes to another session
        else:
            del self._waiting[key]
        return waiter

    def _forget(self, waiter: Waiter) -> None:
        queue = self._waiting.get(waiter.key)
        if queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del self._waiting[waiter.key]


@dataclass
class Tally:
    """The compute of one segment's steps, summed (progressive synthesis): what `run` adds to
    when given one, for `Scheduler.observe_segment`."""

    seconds: float = 0.0
    shared: bool = False  # a step started beside another call


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class Scheduler:
    """Runs blocking engine calls on `workers` threads, by deadline (or fairly across keys)."""

    def __init__(self, workers: int, scheduling: str = "edf", speed: SpeedModel | None = None):
        if scheduling not in SCHEDULING:
            raise ValueError(f"scheduling must be one of {', '.join(SCHEDULING)}")
        self.scheduling = scheduling
        self.slots: Slots = DeadlineSlots(workers) if scheduling == "edf" else FairSlots(workers)
        self.speed = speed or SpeedModel(PRIOR_SECONDS_PER_CALL, PRIOR_SECONDS_PER_PHONEME)
        # calls that started beside another run slower (they share the cores): learned apart,
        # for the real-time capacity
        self.shared_speed = SpeedModel(prior_a=0.5, prior_b=0.045)
        # decoder windows: seconds per call and per frame decoded (int8 ONNX on 2 cores: RTF
        # about 0.5 on 25 ms frames), learned from every window, alone or beside another
        self.window_speed = SpeedModel(prior_a=0.02, prior_b=0.0125)
        # a segment's front pass and first window together, against its phonemes (prior: a
        # 24-frame window with its context and a front pass, int8 ONNX on 2 cores); published
        # when the synthesizer is progressive
        self.first_window = SpeedModel(prior_a=0.5, prior_b=0.004)
        self.progressive = False
        self.audio_per_phoneme = SPEECH_S_PER_PHONEME  # seconds of speech per token, learned
        self.deadline_misses = 0
        self.engine_seconds = 0.0  # engine calls' time (ended, aborted), summed: compute spent
        self.engine_calls = 0
        self._seq = itertools.count()
        self._running: dict[int, tuple[float, float]] = {}  # seq -> (started, cost estimate)
        self.clock: Callable[[], float] = time.perf_counter
        self._active = 0  # engine calls running or waiting for a worker
        self._idle_since = self.clock()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="engine")
        # the engine's learned time per batch size, for `load` (`ProgressiveEngine.batch_curve`)
        self.batch_curve: Callable[[], dict[str, float] | None] = lambda: None

    async def run(
        self,
        key: Hashable,
        fn: Callable[[CancelToken], T],
        *,
        phonemes: int = 0,
        deadline: float | None = None,
        explicit: bool = False,
        cost_s: float | None = None,
        frames: int = 0,
        tally: Tally | None = None,
    ) -> T:
        """Run `fn` on a worker once granted. `deadline` (perf_counter seconds; default now)
        orders the wait under `edf`; an `explicit` one that is missed is counted. A step of a
        progressive segment passes `cost_s` (the segment's compute still to come, for the
        backlog), `frames` (a decoder window's, learned by `window_speed`) and its `tally`,
        and no `phonemes`: the segment is learned whole, by `observe_segment`."""
        seq = next(self._seq)
        cost = self.speed.estimate(phonemes) if cost_s is None else cost_s
        asked = self.clock()
        self._active += 1
        try:
            await self.slots.acquire(key, deadline, cost)
        except BaseException:
            self._ended_one()
            raise
        loop = asyncio.get_running_loop()
        token = CancelToken(deadline)
        started = self.clock()
        shared = bool(self._running)
        self._running[seq] = (started, cost)
        try:
            future = loop.run_in_executor(self._pool, fn, token)
            # whoever stops waiting for it (a second cancel while aborting), its exception, the
            # SynthesisCancelled of a barge-in, is retrieved: never "Future exception was never
            # retrieved" in the log
            future.add_done_callback(_retrieve)
            try:
                result = await asyncio.shield(future)
            except asyncio.CancelledError:
                token.cancel()  # abort the running call, then wait for the thread to stop
                await asyncio.wait([future])
                if not future.cancelled():
                    future.exception()  # the abort asked for: retrieved, not logged as lost
                raise
            finished = self.clock()
            own = max(0.0, finished - started - token.credit_s)  # less other calls' rows
            log.debug(
                "engine call: %d phonemes, waited %.3f s, ran %.3f s (estimate %.3f s)%s, "
                "slack %.3f s",
                phonemes,
                started - asked,
                finished - started,
                cost,
                " beside another" if shared else "",
                (deadline if deadline is not None else asked) - finished,
            )
            if phonemes:
                (self.shared_speed if shared else self.speed).observe(phonemes, own)
            if frames:  # when a window's audio is ready: its whole time, a batch's included
                self.window_speed.observe(frames, finished - started)
            if tally is not None:
                tally.seconds += own
                tally.shared = tally.shared or shared
            if explicit and deadline is not None and finished > deadline:
                self.deadline_misses += 1
            return result
        finally:
            self.engine_seconds += self.clock() - started
            self.engine_calls += 1
            del self._running[seq]
            self.slots.release()
            self._ended_one()

    def _ended_one(self) -> None:
        self._active -= 1
        if not self._active:
            self._idle_since = self.clock()

    def quiet_s(self) -> float:
        """How long no engine call has run or waited for a worker (0 while one does): what
        work done ahead waits on (`ModelService._prepare`). Safe to read from any thread."""
        return 0.0 if self._active else self.clock() - self._idle_since

    def observe_segment(self, phonemes: int, tally: Tally) -> None:
        """A progressive segment of `phonemes` took `tally`'s compute in all its steps."""
        if phonemes:
            (self.shared_speed if tally.shared else self.speed).observe(phonemes, tally.seconds)

    def forget_speed(self) -> None:
        """Back to the priors: what a warm-up call took (a GPU's first call sets up its
        kernels) says nothing of the calls after it."""
        self.speed = dataclasses.replace(self.speed)
        self.shared_speed = dataclasses.replace(self.shared_speed)
        self.window_speed = dataclasses.replace(self.window_speed)
        self.first_window = dataclasses.replace(self.first_window)

    def observe_audio(self, phonemes: int, audio_s: float) -> None:
        """A segment of `phonemes` gave `audio_s` of speech."""
        if phonemes >= 10 and audio_s > 0:
            self.audio_per_phoneme += 0.1 * (audio_s / phonemes - self.audio_per_phoneme)

    def realtime_streams(self, curve: dict[str, float] | None) -> float:
        """Replies the engine can voice at once: workers over the compute each needs per second
        of speech, for a typical segment (`SEGMENT_PHONEMES`) at the speed calls run side by
        side; with batched decoder steps (the engine's `curve`, `batch_curve`), counted in
        batches (`capacity.realtime_streams`)."""
        workers = self.slots.slots
        speed = self.shared_speed if workers > 1 else self.speed
        rtf = speed.estimate(SEGMENT_PHONEMES) / (SEGMENT_PHONEMES * self.audio_per_phoneme)
        return capacity.realtime_streams(workers, rtf, capacity.curve_of(curve))

    def longest_call_s(self) -> float:
        """How long the oldest engine call still running has run (0: none runs): the
        watchdog's measure of a wedged worker."""
        now = self.clock()
        return max((now - started for started, _ in self._running.values()), default=0.0)

    def load(self) -> LoadReport:
        """What `GET /load` says, but for `inflight`, which the route counts."""
        now = self.clock()
        workers = self.slots.slots
        curve = self.batch_curve()  # read once: the engine's batcher lock
        remaining = [max(0.0, cost - (now - started)) for started, cost in self._running.values()]
        waiters = self.slots.waiters()
        # project EDF: each waiter starts when the earliest-free worker is free
        free_at = sorted(remaining + [0.0] * (workers - len(remaining)))[:workers]
        min_slack: float | None = None
        for waiter in waiters:
            start = heapq.heappop(free_at)
            heapq.heappush(free_at, start + waiter.cost_s)
            slack = waiter.deadline - (now + start + waiter.cost_s)
            min_slack = slack if min_slack is None else min(min_slack, slack)
        a, b = self.speed.line
        shared_a, shared_b = self.shared_speed.line
        return LoadReport(
            workers=workers,
            busy=self.slots.busy,
            waiting=len(waiters),
            backlog_s=round((sum(remaining) + sum(w.cost_s for w in waiters)) / workers, 3),
            min_slack_s=None if min_slack is None else round(min_slack, 3),
            deadline_misses=self.deadline_misses,
            seconds_per_call=round(a, 4),
            seconds_per_phoneme=round(b, 5),
            realtime_streams=round(self.realtime_streams(curve), 2),
            shared_seconds_per_call=round(shared_a, 4),
            shared_seconds_per_phoneme=round(shared_b, 5),
            first_window_s=(
                round(self.first_window.estimate(FIRST_CHUNK_PHONEMES), 3)
                if self.progressive
                else None
            ),
            scheduling=self.scheduling,
            batch_curve=curve,
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
