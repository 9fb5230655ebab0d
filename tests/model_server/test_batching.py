"""Batch formation (`model_server.batching`) on literal due steps: earliest deadline first, one
shape class per batch, a first window never made late to fill a batch, waiting only for
sessions that may ask, and the learned time per batch size."""

from __future__ import annotations

import pytest

from model_server.batching import BatchCurve, Due, Policy, Run, Wait, form

POLICY = Policy(window_s=0.004, max_size=3)


def due(id: str, key: str = "64", deadline: float = 10.0, arrived: float = 0.0) -> Due:
    return Due(id, key, 64, deadline, arrived)


def test_nothing_due_is_nothing_to_do() -> None:
    assert form([], 0.0, POLICY, BatchCurve()) is None


def test_a_lone_session_runs_at_once() -> None:
    assert form([due("a")], 0.0, POLICY, BatchCurve(), coming=0) == Run(("a",))


def test_the_earliest_deadline_leads_and_only_its_shape_class_joins() -> None:
    steps = [
        due("late", deadline=9.0),
        due("first", key="16", deadline=1.0),
        due("other16", key="16", deadline=5.0),
        due("soon", deadline=2.0),
    ]
    assert form(steps, 0.0, POLICY, BatchCurve()) == Run(("first", "other16"))


def test_a_batch_is_by_deadline_and_no_larger_than_the_policy() -> None:
    steps = [due(str(i), deadline=float(10 - i)) for i in range(5)]
    assert form(steps, 0.0, POLICY, BatchCurve()) == Run(("4", "3", "2"))


def test_equal_deadlines_go_in_the_order_they_came() -> None:
    steps = [due("b", arrived=0.2), due("a", arrived=0.1)]
    assert form(steps, 0.3, POLICY, BatchCurve()) == Run(("a", "b"))


def test_a_step_waits_for_others_only_while_some_may_come() -> None:
    steps = [due("a", arrived=1.0)]
    assert form(steps, 1.001, POLICY, BatchCurve(), coming=1) == Wait(1.004)
    assert form(steps, 1.001, POLICY, BatchCurve(), coming=0) == Run(("a",))
    assert form(steps, 1.005, POLICY, BatchCurve(), coming=1) == Run(("a",))  # waited enough


def test_a_full_batch_does_not_wait() -> None:
    steps = [due(str(i)) for i in range(3)]
    assert form(steps, 0.0, POLICY, BatchCurve(), coming=2) == Run(("0", "1", "2"))


def test_a_wait_never_passes_the_moment_a_larger_batch_must_start() -> None:
    curve = BatchCurve()
    curve.observe(1, 64, 0.32)  # 5 ms a frame alone
    curve.observe(2, 64, 0.48)
    # the lead needs its audio at 1.5: a batch of 2 takes 0.48 s, so it starts by 1.02
    steps = [due("a", deadline=1.5, arrived=1.0)]
    assert form(steps, 1.0, Policy(window_s=0.1, max_size=3), curve, coming=1) == Wait(1.02)
    assert form(steps, 1.021, Policy(window_s=0.1, max_size=3), curve, coming=1) == Run(("a",))


def test_a_first_window_is_never_made_late_to_fill_a_batch() -> None:
    curve = BatchCurve()
    curve.observe(1, 16, 0.08)  # 80 ms for a first block alone
    curve.observe(2, 16, 0.13)
    curve.observe(3, 16, 0.2)
    steps = [
        Due("first", "16", 16, deadline=0.15, arrived=0.0),
        Due("b", "16", 16, deadline=3.0, arrived=0.0),
        Due("c", "16", 16, deadline=4.0, arrived=0.0),
    ]
    # three rows take 0.2 s, past the first window's deadline; two take 0.13 s, within it
    assert form(steps, 0.0, POLICY, curve) == Run(("first", "b"))
    # when even one row is late, the most rows per call
    assert form(steps, 0.1, POLICY, curve) == Run(("first", "b", "c"))


def test_a_cancelled_step_is_left_out_by_its_caller_and_the_rest_batch() -> None:
    """A cancel inside the queue: the batcher no longer gives the step, and what is due without
    it forms as if it never came."""
    steps = [due("a", deadline=1.0), due("cancelled", deadline=2.0), due("c", deadline=3.0)]
    remaining = [d for d in steps if d.id != "cancelled"]
    assert form(remaining, 0.0, POLICY, BatchCurve()) == Run(("a", "c"))


def test_the_curve_learns_time_per_frame_by_size_and_reads_unseen_sizes_as_no_gain() -> None:
    curve = BatchCurve()
    assert curve.seconds(1, 64) is None
    curve.observe(1, 64, 0.64)
    curve.observe(2, 32, 0.48)
    assert curve.seconds(1, 16) == pytest.approx(0.16)
    assert curve.seconds(2, 64) == pytest.approx(0.96)
    assert curve.seconds(4, 64) == pytest.approx(1.92)  # from 2's, as if no gain
    curve.observe(1, 64, 1.28)  # slower now: an exponentially weighted mean
    assert curve.seconds(1, 64) == pytest.approx(0.64 * 0.8 + 1.28 * 0.2)
    assert curve.report() == {"1": 0.012, "2": 0.015}
    assert curve.batches == {1: 2, 2: 1}


def test_policies_out_of_range_are_refused() -> None:
    with pytest.raises(ValueError, match="not negative"):
        Policy(window_s=-0.001)
    with pytest.raises(ValueError, match="at least one row"):
        Policy(max_size=0)
