"""`bench.sim_engine`'s measured curve: the file it reads, and a call's time from it (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.sim_engine import DEFAULT_CURVE, Curve, SimulatedGpu


def test_the_default_curve_is_the_h200_run_and_says_so() -> None:
    curve = Curve.load(DEFAULT_CURVE)
    assert "NVIDIA H200" in curve.source
    assert "docs/measured.md" in curve.source
    assert (curve.seconds_per_call, curve.seconds_per_phoneme) == (0.04, 0.00037)
    assert curve.beside == 0.15
    assert curve.batch_curve is None
    # "Hello there." (13 phonemes) alone, and with 3 others running
    assert curve.call_s(13, 39, 1, batched=False) == pytest.approx(0.04481)
    assert curve.call_s(13, 39, 4, batched=False) == pytest.approx(0.04481 * 1.45)
    engine = SimulatedGpu(curve, batched=True)
    assert engine.batch_curve() is None  # nothing measured to batch by
    assert "curve: one NVIDIA H200" in engine.description


def _write(tmp_path: Path, body: object) -> Path:
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(body))
    return path


def test_a_measured_batch_curve_batches_the_decoders_part_of_each_call(tmp_path: Path) -> None:
    """A call of 40 frames, 0.1 s alone, 0.08 s of it the decoder's (2 ms a frame); 4 calls at
    once: the rest 10 % slower per other call, the decoder's part as a row of a batch of 4 (5 ms
    a frame for all 4 rows)."""
    path = _write(
        tmp_path,
        {
            "source": "a test",
            "seconds_per_call": 0.1,
            "seconds_per_phoneme": 0.0,
            "beside": 0.1,
            "batch_curve": {"1": 0.002, "4": 0.005},
        },
    )
    curve = Curve.load(path)
    assert curve.batch_curve == {1: 0.002, 4: 0.005}
    decoder = 40 * 0.002
    assert curve.call_s(0, 40, 1, batched=True) == pytest.approx(0.1)
    rest = (0.1 - decoder) * 1.3
    assert curve.call_s(0, 40, 4, batched=True) == pytest.approx(rest + 40 * 0.005)
    assert curve.call_s(0, 40, 4, batched=False) == pytest.approx(0.1 * 1.3)
    engine = SimulatedGpu(curve, batched=True)
    assert engine.batch_curve() == {"1": 0.002, "4": 0.005}  # what GET /load publishes
    assert SimulatedGpu(curve, batched=False).batch_curve() is None


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ([], "a JSON object with its source"),
        ({"seconds_per_call": 0.1, "seconds_per_phoneme": 0.0}, "a JSON object with its source"),
        ({"source": "x", "seconds_per_call": 0.1}, "not a curve"),
        ({"source": "x", "seconds_per_call": "soon", "seconds_per_phoneme": 0}, "not a curve"),
        ({"source": "x", "seconds_per_call": -1, "seconds_per_phoneme": 0}, "not negative"),
        (
            {"source": "x", "seconds_per_call": 1, "seconds_per_phoneme": 0, "batch_curve": [1]},
            "not a curve",
        ),
    ],
)
def test_a_file_that_is_not_a_curve_says_what_is_wrong(
    tmp_path: Path, body: object, said: str
) -> None:
    with pytest.raises(ValueError, match=said):
        Curve.load(_write(tmp_path, body))
