"""`model_server.engines.carried_norms.carried_in`: the one rule by which every engine that
carries its norms' statistics weighs the voice's prior against the frames decoded so far."""

from __future__ import annotations

import numpy as np
import pytest

from model_server.engines.carried_norms import NormStats, carried_in


def stats(value: float, frames: float) -> NormStats:
    """One norm, one channel: `frames` frames of activations `value`."""
    return NormStats(
        (np.full((1, 1, 1), value * frames, np.float32),),
        (np.full((1, 1, 1), value * value * frames, np.float32),),
        frames,
    )


def test_the_prior_stands_in_for_the_frames_still_to_come_at_most_its_own_weight() -> None:
    prior, seen = stats(2.0, 96), stats(1.0, 24)
    # 40 frames after the window: the prior weighs 40 of them, beside the 24 seen
    forty = carried_in(prior, seen, 40)
    assert forty.frames == 64
    assert forty.sums[0].item() == pytest.approx(2.0 * 40 + 1.0 * 24)
    assert forty.squares[0].item() == pytest.approx(4.0 * 40 + 1.0 * 24)
    # far from the end: the prior weighs its own 96 frames, no more
    assert carried_in(prior, seen, 500).frames == 96 + 24
    # the last window: the segment's own frames alone, as one call is normalised
    assert carried_in(prior, seen, 0) is seen


def test_with_nothing_seen_or_no_prior_what_there_is_is_carried() -> None:
    prior, seen = stats(2.0, 96), stats(1.0, 24)
    first = carried_in(prior, None, 30)  # the first window: the prior alone
    assert first is not None
    assert first.frames == 30
    assert first.sums[0].item() == pytest.approx(60.0)
    assert carried_in(None, seen, 30) is seen  # no prior: the cores decoded so far
    assert carried_in(None, None, 30) is None  # nothing: each norm its window's own
    empty = NormStats.none(1)  # the onnx engine's "no prior": no frames to weigh
    assert carried_in(empty, seen, 30) is seen
