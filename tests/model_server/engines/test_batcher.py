"""`engines/batcher.Batcher` with stand-in streams and a stand-in clock: what a batch charges
each row's call (`CancelToken.credit_s`), and the curve it learns."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from model_server.batching import Policy
from model_server.engines.base import CancelToken
from model_server.engines.batcher import Batcher

FRAMES = 16


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Stream:
    """A segment's stream whose step takes 0.1 s alone and whose batch of any rows 0.3 s."""

    clock: _Clock

    def __init__(self) -> None:
        self.steps = 0

    def batch_key(self) -> Any:
        return (FRAMES, False)

    @property
    def next_frames(self) -> int:
        return FRAMES

    def step(self) -> None:
        self.clock.now += 0.1
        self.steps += 1

    @staticmethod
    def step_together(streams: list[Any]) -> None:
        streams[0].clock.now += 0.3
        for stream in streams:
            stream.steps += 1


def test_a_batched_row_is_charged_its_step_alone_and_credited_the_rest() -> None:
    clock = _Clock()
    _Stream.clock = clock
    batcher = Batcher(1, Policy(window_s=0.0, max_size=4), clock=clock)
    try:
        first = CancelToken(deadline=200.0)
        lone = _Stream()
        batcher.step(lone, first)  # alone: charged all of it
        assert first.credit_s == 0.0
        assert batcher.curve.seconds(1, FRAMES) == pytest.approx(0.1)

        hold = threading.Event()
        holding = threading.Thread(target=batcher.run, args=(hold.wait,))
        holding.start()
        streams, tokens = [_Stream(), _Stream()], [CancelToken(200.0), CancelToken(200.0)]
        threads = [
            threading.Thread(target=batcher.step, args=(s, t))
            for s, t in zip(streams, tokens, strict=True)
        ]
        for t in threads:
            t.start()
        with batcher._cond:  # both queued behind the held thread: they run as one batch
            assert batcher._cond.wait_for(lambda: len(batcher._due) == 2, timeout=60)
        hold.set()
        for t in threads:
            t.join()
        holding.join()
        assert [s.steps for s in streams] == [1, 1]
        assert batcher.curve.batches == {1: 1, 2: 1}
        # the batch took 0.3 s; each row's step alone takes 0.1 s: 0.2 s of it was the other's
        assert [t.credit_s for t in tokens] == [pytest.approx(0.2), pytest.approx(0.2)]
    finally:
        batcher.close()


def test_with_no_step_alone_learned_a_row_is_charged_its_share() -> None:
    clock = _Clock()
    _Stream.clock = clock
    batcher = Batcher(1, Policy(window_s=0.0, max_size=4), clock=clock)
    try:
        hold = threading.Event()
        holding = threading.Thread(target=batcher.run, args=(hold.wait,))
        holding.start()
        streams = [_Stream(), _Stream(), _Stream()]
        tokens = [CancelToken(200.0) for _ in streams]
        threads = [
            threading.Thread(target=batcher.step, args=(s, t))
            for s, t in zip(streams, tokens, strict=True)
        ]
        for t in threads:
            t.start()
        with batcher._cond:
            assert batcher._cond.wait_for(lambda: len(batcher._due) == 3, timeout=60)
        hold.set()
        for t in threads:
            t.join()
        holding.join()
        assert [t.credit_s for t in tokens] == [pytest.approx(0.2)] * 3  # 0.3 - 0.3 / 3
    finally:
        batcher.close()
