"""`bench/soak_report.py`: the pure part of `make soak` (duration, metrics, what is unexpected,
the verdict's rules, the table)."""

from __future__ import annotations

import math
import sys

import pytest
from prometheus_client import generate_latest

from bench.soak_report import (
    MIB,
    Rules,
    Sample,
    ServiceSample,
    is_refusal,
    log_problems,
    new_error_codes,
    outcome_table,
    parse_duration,
    read_metrics,
    rows_to_show,
    table,
    unexpected,
    verdict,
    verdict_lines,
    windows,
)
from gateway.metrics import GatewayMetrics


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("30m", 1800), ("2h", 7200), ("1h30m", 5400), ("1.5h", 5400), (" 30M ", 1800)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "m", "-5m", "0s", "30x", "30 m", "5m5", "h1"])
def test_durations_need_a_positive_number_and_a_unit(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


METRICS = """\
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.2e+08
# TYPE process_open_fds gauge
process_open_fds 15.0
# TYPE python_threads gauge
python_threads 3.0
# TYPE asyncio_tasks gauge
asyncio_tasks 21.0
# TYPE python_info gauge
python_info{implementation="CPython",major="3"} 1.0
# TYPE gateway_errors counter
gateway_errors_total{code="overloaded"} 4.0
gateway_errors_total{code="invalid_json"} 1.0
gateway_errors_created{code="overloaded"} 1.7e+09
# TYPE model_server_deadline_misses counter
model_server_deadline_misses_total 5.0
"""


def test_metrics_are_read_from_the_exposition_text() -> None:
    s = read_metrics(METRICS)
    assert (s.rss_bytes, s.fds, s.threads, s.tasks) == (1.2e8, 15, 3, 21)
    assert s.errors == {"overloaded": 4, "invalid_json": 1}
    assert s.deadline_misses == 5


def test_a_missing_family_reads_as_nan() -> None:
    s = read_metrics("# TYPE process_open_fds gauge\nprocess_open_fds 9\n")
    assert s.fds == 9
    assert math.isnan(s.rss_bytes)
    assert math.isnan(s.tasks)
    assert s.errors == {}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_gateway_registry_gives_every_gauge() -> None:
    s = read_metrics(generate_latest(GatewayMetrics().registry).decode())
    assert s.rss_bytes > 0
    assert s.fds > 0
    assert s.threads >= 1
    assert math.isnan(s.tasks)  # scraped outside any event loop: left out


# --- outcomes ------------------------------------------------------------------------------------


def test_refusals_because_of_load_are_expected() -> None:
    assert is_refusal(503, "overloaded")
    assert is_refusal(429, "rate_limited")
    assert is_refusal(429, None)
    assert is_refusal(None, "overloaded")  # a WebSocket error frame
    assert not is_refusal(503, "tts_unavailable")
    assert not is_refusal(400, "invalid_json")
    assert unexpected(503, "overloaded") is None
    assert unexpected(429, "too_many_sessions") is None


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ({"status": 500, "code": "internal_error"}, "internal_error"),
        ({"status": 502, "code": "tts_error"}, "HTTP 502 tts_error"),
        ({"status": 503, "code": "tts_unavailable"}, "HTTP 503 tts_unavailable"),
        ({"status": 504}, "HTTP 504"),
        ({"code": "internal_error"}, "internal_error"),
        ({"close_code": 1011}, "WebSocket closed with 1011"),
        (
            {"status": 400, "text": 'Traceback (most recent call last):\n  File "x"'},
            "traceback in a response",
        ),
    ],
)
def test_unexpected_errors(answer: dict[str, object], why: str) -> None:
    assert unexpected(**answer) == why  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "answer",
    [{"status": 200}, {"status": 204}, {"status": 400, "code": "invalid_json"},
     {"status": 415, "code": "unsupported_media_type"}, {"close_code": 1009},
     {"close_code": 1000}, {}],
)  # fmt: skip
def test_expected_answers(answer: dict[str, object]) -> None:
    assert unexpected(**answer) is None  # type: ignore[arg-type]


def test_new_error_codes_are_those_that_rose_outside_the_expected() -> None:
    first = {"overloaded": 2.0, "tts_error": 1.0}
    last = {"overloaded": 9.0, "tts_error": 1.0, "invalid_json": 3.0, "internal_error": 2.0}
    assert new_error_codes(first, last, {"overloaded", "invalid_json"}) == {"internal_error": 2}
    assert new_error_codes(first, first, ()) == {}


def test_log_problems() -> None:
    log = "\n".join(
        [
            "model-server: listening on http://127.0.0.1:8080",
            "2026-11-30 13:01:03,336 WARNING gateway.reply.pipeline: request ended early",
            "2026-11-30 13:01:03,336 ERROR asyncio: Future exception was never retrieved",
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in <module>',
            "ERROR:    Exception in ASGI application",
        ]
    )
    problems = log_problems(log)
    assert [line.split()[-1] for line in problems] == ["retrieved", "last):", "application"]


# --- the verdict -------------------------------------------------------------------------------


def service(
    rss_mib: float = 100, fds: float = 15, tasks: float = 20, threads: float = 4
) -> ServiceSample:
    return ServiceSample(rss_mib * MIB, fds, tasks, threads)


def run(duration_s: float = 600, every_s: float = 10) -> list[Sample]:
    """Samples of a steady run, every 10 s from 0 to `duration_s`."""
    return [
        Sample(t, service(), service(rss_mib=600, fds=20, tasks=8, threads=5))
        for t in range(0, int(duration_s) + 1, int(every_s))
    ]


def with_gateway(samples: list[Sample], after_s: float, **changes: float) -> list[Sample]:
    """The same samples, with the gateway's gauges changed from `after_s` on."""
    out = []
    for s in samples:
        if s.t_s >= after_s:
            g = s.gateway
            values = {"rss_mib": g.rss_bytes / MIB, "fds": g.fds, "tasks": g.tasks}
            values["threads"] = g.threads
            values.update(changes)
            s = Sample(s.t_s, service(**values), s.model_server)
        out.append(s)
    return out


def failed(samples: list[Sample], duration_s: float = 600, served: int = 100) -> list[str]:
    return [c.name for c in verdict(samples, duration_s, {}, served).checks if not c.ok]


def test_windows_after_warm_up() -> None:
    long = windows(run(1800), 1800, Rules())
    assert long is not None
    assert [s.t_s for s in long.baseline] == [120, 130, 140]  # after the first 2 minutes
    assert [s.t_s for s in long.end] == [1780, 1790, 1800]
    assert [long.reference[0].t_s, long.reference[-1].t_s] == [0, 140]
    short = windows(run(90), 90, Rules())
    assert short is not None
    assert [s.t_s for s in short.baseline] == [20, 30, 40]  # after the first 20 %: 18 s
    assert [s.t_s for s in short.end] == [70, 80, 90]
    assert windows(run(40), 40, Rules()) is None  # 4 samples after warm-up: too few


def test_a_steady_run_passes() -> None:
    result = verdict(run(), 600, {}, served=40)
    assert result.ok, verdict_lines(result)
    assert verdict_lines(result).endswith("verdict: PASS")


def test_rss_growth_past_five_percent_fails() -> None:
    assert failed(with_gateway(run(), 400, rss_mib=104.9)) == []
    assert failed(with_gateway(run(), 400, rss_mib=105.5)) == ["gateway RSS growth <= 5%"]


def test_growth_during_warm_up_does_not_count() -> None:
    samples = with_gateway(run(), 0, rss_mib=60)
    samples = with_gateway(samples, 100, rss_mib=100)  # the last of warm-up (120 s)
    assert failed(samples) == []


def test_descriptors_tasks_and_threads_must_stay_flat() -> None:
    samples = run()
    assert failed(with_gateway(samples, 300, fds=15 + 8, tasks=20 + 16, threads=4 + 2)) == []
    leaking = with_gateway(samples, 300, fds=24, tasks=37, threads=7)
    assert failed(leaking) == ["gateway fds flat", "gateway tasks flat", "gateway threads flat"]


def test_a_peak_during_the_reference_window_raises_the_limit() -> None:
    samples = with_gateway(run(), 130, tasks=40)
    samples = with_gateway(samples, 140, tasks=50)
    samples = with_gateway(samples, 150, tasks=30)
    assert failed(samples) == []  # the end (30) is below the reference max (50) + 16


def test_one_high_sample_at_the_end_is_not_a_trend() -> None:
    samples = run()
    last = samples[-1]
    samples[-1] = Sample(last.t_s, service(tasks=200), last.model_server)
    assert failed(samples) == []  # the end's median


def test_unexpected_errors_fail() -> None:
    result = verdict(run(), 600, {"sse reply: internal_error": 1}, served=40)
    assert not result.ok
    (check,) = [c for c in result.checks if c.name == "no unexpected error"]
    assert check.detail == "sse reply: internal_error: 1"


def test_a_run_that_served_nothing_fails() -> None:
    assert failed(run(), served=9) == ["the load ran"]  # 10 minutes: at least 10
    assert failed(run(), served=10) == []


def test_a_run_too_short_for_both_windows_fails() -> None:
    result = verdict(run(40), 40, {}, served=1)
    assert [c.name for c in result.checks if not c.ok] == ["enough samples"]


# --- the table -----------------------------------------------------------------------------------


def test_table_rows() -> None:
    samples = run(190)
    assert rows_to_show(samples, per_minute=False) == samples
    per_minute = [s.t_s for s in rows_to_show(samples, per_minute=True)]
    assert per_minute == [50, 110, 170, 190]  # the last of each minute


def test_table_text() -> None:
    samples = [Sample(70, service(), ServiceSample(600 * MIB, 20, 8, 5, {}))]
    errors = ServiceSample(100 * MIB, 15, 20, 4, {"overloaded": 3, "tts_error": 0})
    samples.append(Sample(80, errors, samples[0].model_server))
    lines = table(samples).splitlines()
    assert lines[0].split("|")[1].split() == ["gateway", "RSS", "MiB", "fds", "tasks", "thr"]
    assert lines[2].split("|")[:3] == [
        "   1:10 ",
        "           100.0    15    20    4 ",
        "         600.0    20     8    5 ",
    ]
    assert lines[2].endswith("| -")
    assert lines[3].endswith("| overloaded 3")
    outcomes = outcome_table({"sse reply: served": 5, "barge-in: cancelled": 2}).splitlines()
    assert outcomes[0].split() == ["barge-in:", "cancelled", "2"]
    assert outcomes[-1].split() == ["total", "7"]


def test_a_short_soak_is_sampled_often_enough_for_its_verdict() -> None:
    rules = Rules()
    assert rules.sample_times(600, 10)[:3] == [0, 10, 20]  # long runs keep the asked pace
    assert rules.sample_times(600, 10)[-1] == 600
    assert rules.sample_times(45, 10) == [0, 6, 12, 18, 24, 30, 36, 42, 45]
    for duration_s in (20, 30, 45, 61, 90):
        times = rules.sample_times(duration_s, 10)
        samples = [
            Sample(t, service(), service(rss_mib=600, fds=20, tasks=8, threads=5)) for t in times
        ]
        result = verdict(samples, duration_s, {}, served=10)
        assert result.ok, (duration_s, [c for c in result.checks if not c.ok])
