"""The model server's capacity counted in batches (`kokoro_contract.capacity`, pure): literal
curves in, replies at once and batched costs out."""

from __future__ import annotations

import pytest

from kokoro_contract import capacity
from kokoro_contract.load import FRAME_S

# a GPU-like curve: a frame of one row 4 ms, of 16 rows 8 ms (each row an eighth of alone)
GPU = {1: 0.004, 2: 0.0044, 4: 0.005, 8: 0.006, 16: 0.008}
# this CPU's: two rows took longer than two steps alone (docs/measured.md, #50)
CPU = {1: 0.0052, 2: 0.0138}


def test_the_reported_curve_is_read_by_size() -> None:
    assert capacity.curve_of({"1": 0.004, "16": 0.008}) == {1: 0.004, 16: 0.008}
    assert capacity.curve_of(None) is None
    assert capacity.curve_of({}) is None


def test_a_size_not_seen_is_read_from_the_nearest_below_with_no_more_gain() -> None:
    assert capacity.batch_seconds(GPU, 8, 10) == pytest.approx(0.06)
    assert capacity.batch_seconds(GPU, 3, 10) == pytest.approx(0.044 * 3 / 2)
    assert capacity.batch_seconds(GPU, 32, 10) == pytest.approx(0.16)  # 16's rows, twice
    assert capacity.batch_seconds({4: 0.01}, 2, 10) is None  # below the smallest seen


def test_a_rows_share_of_its_batch() -> None:
    assert capacity.row_share(GPU, 1) == 1.0
    assert capacity.row_share(GPU, 16) == pytest.approx(0.125)
    assert capacity.row_share(GPU, 64) == pytest.approx(0.125)  # no more gain past 16
    assert capacity.row_share(CPU, 2) == pytest.approx(0.0138 / 2 / 0.0052)  # above 1: a loss
    assert capacity.row_share(None, 8) == 1.0
    assert capacity.row_share({4: 0.01}, 4) == 1.0  # alone unknown: no gain assumed


def test_batched_work_saves_only_its_decoder_steps_share() -> None:
    decoder = GPU[1] / FRAME_S  # 0.16 s of decoder steps per second of speech, alone
    assert capacity.decoder_speech_s(GPU) == pytest.approx(decoder)
    assert capacity.batched_s(0.2, 1.0, GPU, 1) == pytest.approx(0.2)
    assert capacity.batched_s(0.2, 1.0, GPU, 16) == pytest.approx(0.2 - decoder * 0.875)
    assert capacity.batched_s(0.6, 3.0, GPU, 16) == pytest.approx(0.6 - 3 * decoder * 0.875)
    assert capacity.batched_s(0.2, 1.0, None, 16) == 0.2
    assert capacity.batched_s(0.2, 1.0, CPU, 2) == 0.2  # a loss: the learned speeds hold it
    assert capacity.decoder_speech_s(None) == 0.0


def test_without_a_curve_the_capacity_is_the_workers_over_a_replys_compute() -> None:
    assert capacity.realtime_streams(2, 0.82, None) == pytest.approx(2 / 0.82)
    assert capacity.realtime_streams(4, 0.0, None) == 4.0


def test_batches_raise_the_capacity_as_far_as_the_decoder_thread_keeps_up() -> None:
    """Four workers, 0.2 s of compute per second of speech alone, 0.16 of it the decoder's:
    unbatched 20 replies; in batches of 16 each costs 0.06 s (4 workers: 66 replies), but the
    one decoder thread runs 50 replies' steps at 16 rows a batch (0.02 s a reply): 50."""
    assert capacity.realtime_streams(4, 0.2, GPU) == pytest.approx(50.0)
    # the workers the limit: a front pass twice as long
    alone = 0.16 + 0.2
    assert capacity.realtime_streams(4, alone, GPU) == pytest.approx(4 / (alone - 0.16 * 0.875))
    # a curve only to 2 rows: 2 at most batched together, and more in batches of 2
    small = {1: 0.004, 2: 0.0044}
    share = 0.0044 / 2 / 0.004
    assert capacity.realtime_streams(1, 0.2, small) == pytest.approx(
        min(1 / (0.2 - 0.16 * (1 - share)), 1 / (0.16 * share))
    )


def test_a_curve_that_gains_nothing_leaves_the_unbatched_capacity() -> None:
    assert capacity.realtime_streams(2, 0.82, CPU) == pytest.approx(2 / 0.82)
    linear = {1: 0.004, 2: 0.008, 4: 0.016}
    assert capacity.realtime_streams(4, 0.2, linear) == pytest.approx(20.0)
