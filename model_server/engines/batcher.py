"""The streamed decoder's torch work on one thread, the decoder steps of several segments run as
one batched call (`--batch on`).

Like `streamed.TorchThread` (all of a decoder's torch work on one thread, on all its cores), but
a segment's decoder step (a block of its frames into the streamed generator) is not run the
moment it is asked for: the steps due from several segments that share a shape class (a block
of as many frames, each past its segment's first) are stacked into one call
(`StreamingDecoder.push_generator_together`), each segment's rows its own, bit for bit what it
would get alone. Which steps, and when, is `batching.form`'s: earliest deadline first (the
deadline the scheduler gave the call, `CancelToken.deadline`), no batch that would make the
leading step late where a smaller one would not, a short wait for others only while other
segments are decoding (`decoding`). The time each batch size takes is learned (`curve`,
`GET /load`'s `batch_curve`), and each row's call is charged its step alone (as the curve
says size 1 takes), the rest of the batch's time credited to it (`CancelToken.credit_s`): the
scheduler's learned speeds stay a call's alone, the batch's gain counted by the curve.

Other torch work (a segment's body pass, building its stream, collecting its audio) runs here
too, before any step (`run`). A step cancelled while it waits leaves the queue at once
(`SynthesisCancelled` for its caller); one cancelled while its batch runs gets its rows and
drops them: the other rows are untouched.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from model_server.batching import BatchCurve, Due, Policy, Run, form
from model_server.engines.base import CancelToken
from model_server.errors import SynthesisCancelled, SynthesisFailed

T = TypeVar("T")


class Batchable(Protocol):
    """A segment's stream as the batcher steps it (`streamed.SegmentStream`)."""

    def batch_key(self) -> Hashable | None:
        """What its next step may be batched with (None: it runs alone)."""
        ...

    @property
    def next_frames(self) -> int: ...

    def step(self) -> None:
        """Its next step, alone."""
        ...

    @staticmethod
    def step_together(streams: list[Any]) -> None:
        """The next step of each (one batch key), as one call."""
        ...


@dataclass
class _Step:
    due: Due
    stream: Batchable
    cancel: CancelToken
    future: Future[None]


class Batcher:
    """One thread for a decoder's torch work, its segments' steps batched (module docstring)."""

    def __init__(
        self, threads: int, policy: Policy, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.policy = policy
        self.curve = BatchCurve()
        self._clock = clock
        self._cond = threading.Condition()
        self._calls: deque[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = deque()
        self._due: dict[int, _Step] = {}
        self._ids = itertools.count()
        self._decoding = 0  # segments between their steps: they may ask soon
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="torch-batcher", daemon=True)
        self._thread.start()
        self.run(torch.set_num_threads, threads)

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the thread, waited for (before any step that is due)."""
        future: Future[T] = Future()
        with self._cond:
            if self._closed:
                raise SynthesisFailed("the decoder's thread is closed")
            self._calls.append((fn, args, future))
            self._cond.notify()
        return future.result()

    @contextmanager
    def decoding(self) -> Iterator[None]:
        """Around a segment's steps for a window: while inside, its next step may come soon,
        which a due step may wait for (`batching.form`'s `coming`)."""
        with self._cond:
            self._decoding += 1
        try:
            yield
        finally:
            with self._cond:
                self._decoding -= 1
                self._cond.notify()

    def step(self, stream: Batchable, cancel: CancelToken) -> None:
        """`stream`'s next step, in a batch with other segments' where it can be; waited for.
        `SynthesisCancelled` if `cancel` fires before it runs."""
        key = stream.batch_key()
        if key is None:
            self.run(stream.step)
            return
        future: Future[None] = Future()
        now = self._clock()
        deadline = now if cancel.deadline is None else cancel.deadline
        with self._cond:
            if self._closed:
                raise SynthesisFailed("the decoder's thread is closed")
            n = next(self._ids)
            due = Due(n, key, stream.next_frames, deadline, now)
            self._due[n] = _Step(due, stream, cancel, future)
            self._cond.notify()
        cancel.on_cancel(self._wake)
        future.result()

    def batch_curve(self) -> dict[str, float]:
        """`GET /load`'s `batch_curve` (`BatchCurve.report`), from any thread."""
        with self._cond:
            return self.curve.report()

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        """The thread ends once what runs has run; what waits fails."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _loop(self) -> None:
        while True:
            with self._cond:
                job = self._next()
            if job is None:
                return
            if isinstance(job, list):
                self._batch(job)
            else:
                fn, args, future = job
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args))
                    except BaseException as exc:  # the caller's to handle, on its thread
                        future.set_exception(exc)

    def _next(self) -> list[_Step] | tuple[Callable[..., Any], tuple[Any, ...], Future[Any]] | None:
        """What to run next (under the lock), waiting as `form` says; None: closed."""
        while True:
            if self._closed:
                for step in self._due.values():
                    step.future.set_exception(SynthesisFailed("the decoder's thread is closed"))
                self._due.clear()
                for _, _, future in self._calls:
                    future.set_exception(SynthesisFailed("the decoder's thread is closed"))
                self._calls.clear()
                return None
            if self._calls:
                return self._calls.popleft()
            for n, step in list(self._due.items()):
                if step.cancel.cancelled:
                    del self._due[n]
                    step.future.set_exception(SynthesisCancelled())
            now = self._clock()
            coming = max(0, self._decoding - len(self._due))
            decision = form(
                [s.due for s in self._due.values()], now, self.policy, self.curve, coming
            )
            if isinstance(decision, Run):
                return [self._due.pop(n) for n in decision.ids]  # type: ignore[call-overload]
            self._cond.wait(None if decision is None else max(0.0, decision.until - now))

    def _batch(self, steps: list[_Step]) -> None:
        started = self._clock()
        try:
            if len(steps) == 1:
                steps[0].stream.step()
            else:
                type(steps[0].stream).step_together([s.stream for s in steps])
        except BaseException as exc:  # every row's caller hears it, on its own thread
            for step in steps:
                step.future.set_exception(exc)
            return
        took = self._clock() - started
        frames = steps[0].due.frames
        with self._cond:
            self.curve.observe(len(steps), frames, took)
            alone = self.curve.seconds(1, frames) if len(steps) > 1 else took
        # each row's call is charged its step alone (as learned; unknown: its share), the rest
        # of the batch's time is credited (`CancelToken.credit_s`)
        own = took / len(steps) if alone is None else min(alone, took)
        for step in steps:
            step.cancel.credit_s += took - own
            step.future.set_result(None)
