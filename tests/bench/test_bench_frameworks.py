"""`bench/bench_frameworks.py`: its pure parts (the spread of a column, the barge-in table); the
timings themselves are `make bench-frameworks`'s, never checked here."""

from __future__ import annotations

from dataclasses import replace

from bench.bench_frameworks import _spread, barge_in_table
from bench.frameworks import BargeIn


def barge_in(seconds: float, leftover: int = 0) -> BargeIn:
    return BargeIn(
        plugin="pipecat",
        barge_in_s=seconds,
        first_audio_s=0.4,
        leftover_frames=leftover,
        leftover_s=0.1 * leftover,
        overtaken_frames=1,
        overtaken_s=0.4,
        next_audio_s=1.5,
        next_first_frame_s=0.2,
    )


def test_a_spread_is_the_median_and_the_range_in_ms() -> None:
    assert _spread([0.5, 0.25, 0.3]) == "300 (250-500)"


def test_a_first_frame_the_client_does_not_give_is_a_dash() -> None:
    runs = [replace(barge_in(0.3), plugin="livekit", next_first_frame_s=None)] * 2
    row = barge_in_table({"livekit": {"old": runs, "v2": runs}}, "c2154e7").splitlines()[2]
    assert row.endswith("| - / - | 0 / 0 |")


def test_failed_barge_ins_are_counted_left_out_of_the_medians_and_said() -> None:
    refused = replace(barge_in(9.0), error="overloaded: the speech service is at capacity")
    results = {
        "pipecat": {
            "old": [barge_in(0.4), barge_in(0.6)],
            "v2": [barge_in(0.2), refused, barge_in(0.4)],
        }
    }
    lines = barge_in_table(results, "c2154e7").splitlines()
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[2] == "300 (200-400)"
    assert cells[-1] == "0 / 1"
    assert lines[3:] == ["pipecat v2: overloaded: the speech service is at capacity"]
    all_failed = {"pipecat": {"old": [refused], "v2": [barge_in(0.2)]}}
    assert barge_in_table(all_failed, "c2154e7").splitlines()[2].endswith("| 1 / 0 |")


def test_the_barge_in_table_gives_each_version_and_v2_against_the_old() -> None:
    results = {
        "pipecat": {
            "old": [barge_in(0.4), barge_in(0.5, leftover=2), barge_in(0.6)],
            "v2": [barge_in(0.2), barge_in(0.25), barge_in(0.3)],
        }
    }
    header, rule, row = barge_in_table(results, "c2154e7").splitlines()
    assert "old (c2154e7)" in header
    assert rule.count("---") == header.count("|") - 1
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["pipecat", "500 (400-600)", "250 (200-300)", "0.50x"]
    assert cells[4] == "2 / 0 frames, 0.20 / 0.00 s"
    assert cells[5] == "3 / 3 frames, 1.20 / 1.20 s"
    assert cells[6:] == ["1.50 / 1.50", "0.20 / 0.20", "0 / 0"]
