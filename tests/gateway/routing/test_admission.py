"""Admission control and routing (`gateway.routing.admission`), pure: published loads in, the chosen
model server or a refusal out."""

from __future__ import annotations

import dataclasses

import pytest

from gateway.routing.admission import (
    Candidate,
    LoadReport,
    Refusal,
    choose,
    refusal,
)
from kokoro_contract.asks import Ask
from kokoro_contract.load import FIRST_CHUNK_PHONEMES


def load(
    backlog_s: float = 0.0, busy: int = 0, workers: int = 2, min_slack_s: float | None = None
) -> LoadReport:
    # every call: 0.1 s + 20 ms per phoneme, so a first chunk costs 1.0 s
    return LoadReport(workers, busy, 0, backlog_s, min_slack_s, 0.1, 0.9 / FIRST_CHUNK_PHONEMES)


def under_way(*chunks: tuple[float, float]) -> tuple[Ask, ...]:
    """One reply under way, with the spare time of each chunk it has still to come."""
    return (Ask.under_way(chunks),)


def replies(n: int) -> tuple[Ask, ...]:
    """`n` replies under way with nothing left to synthesize (their playback runs)."""
    return (Ask.under_way(),) * n


def side_by_side(report: LoadReport) -> LoadReport:
    """`report` with calls side by side at 0.15 s + 30 ms per phoneme: a 60-phoneme segment
    half as long again as alone (1.95 s against 1.3 s)."""
    return dataclasses.replace(
        report, shared_seconds_per_call=0.15, shared_seconds_per_phoneme=0.03
    )


def test_the_published_load_parses() -> None:
    body = {
        "workers": 2,
        "busy": 1,
        "waiting": 3,
        "backlog_s": 1.5,
        "min_slack_s": None,
        "deadline_misses": 0,
        "seconds_per_call": 0.1,
        "seconds_per_phoneme": 0.02,
        "scheduling": "edf",
        "inflight": 2,
    }
    report = LoadReport.from_json(body)  # an older server: no speeds side by side
    assert report == LoadReport(2, 1, 3, 1.5, None, 0.1, 0.02, inflight=2)
    assert report.first_chunk_s == pytest.approx(0.1 + 0.02 * FIRST_CHUNK_PHONEMES)
    body |= {"shared_seconds_per_call": 0.15, "shared_seconds_per_phoneme": 0.03}
    assert LoadReport.from_json(body) == side_by_side(report)
    # a progressive server: a new reply's start is its first window, not its first chunk
    progressive = LoadReport.from_json(body | {"first_window_s": 0.3})
    assert progressive.first_window_s == 0.3
    assert (progressive.first_chunk_s, progressive.first_audio_s) == (0.3, 0.3)


def test_a_progressive_start_costs_the_replies_in_progress_only_its_first_window() -> None:
    whole = side_by_side(load())  # a first chunk: 1.0 s of a worker before its audio
    progressive = dataclasses.replace(whole, first_window_s=0.2)
    # a reply with 0.8 s to spare and 1.0 s of synthesis left: the whole first chunk's share
    # (0.5 s) and the slowdown of what it has left (0.5 s) do not fit; the first window does
    assert refusal(whole, budget_s=3.0, asks=under_way((0.8, 1.0))) is not None
    assert refusal(progressive, budget_s=3.0, asks=under_way((0.8, 1.0))) is None


def test_an_idle_server_takes_the_reply() -> None:
    assert load().first_audio_s == pytest.approx(1.0)
    assert refusal(load(), budget_s=3.0) is None


def test_an_idle_server_is_never_refused_whatever_it_has_learned() -> None:
    """One slow call taught it 2.6 s per call: every first chunk now looks past the budget,
    and refusing would keep it from ever learning better (nothing else would be served)."""
    slow = dataclasses.replace(load(), seconds_per_call=2.6)
    assert slow.first_audio_s > 3.0
    assert refusal(slow, budget_s=3.0) is None
    assert refusal(dataclasses.replace(slow, busy=1), budget_s=3.0) is not None
    assert refusal(slow, budget_s=3.0, asks=replies(1)) is not None
    # far past the budget, idle or not: the budget is the operator's word
    assert refusal(slow, budget_s=1.0) is not None


def test_a_free_worker_means_no_wait_whatever_the_backlog_per_worker() -> None:
    assert load(backlog_s=5.0, busy=1).first_audio_s == pytest.approx(1.0)
    assert load(backlog_s=5.0, busy=2).first_audio_s == pytest.approx(6.0)


def test_first_audio_past_the_budget_is_refused_with_when_to_retry() -> None:
    refused = refusal(load(backlog_s=4.5, busy=2), budget_s=3.0)
    assert refused == Refusal("first audio would take 5.5 s; the budget is 3.0 s", 4)
    assert refused.code == "overloaded"
    assert not refused.deferrable  # waiting only shrinks what is left of the budget


def test_work_in_progress_with_too_little_slack_refuses_a_new_reply() -> None:
    # the new first chunk (1.0 s) would go ahead of segments with 0.4 s of slack
    refused = refusal(load(min_slack_s=0.4), budget_s=3.0)
    assert refused is not None
    assert "replies in progress would miss their deadlines" in refused.reason
    assert refused.deferrable  # their slack grows as their chunks complete
    assert refusal(load(min_slack_s=1.5), budget_s=3.0) is None


def test_the_least_loaded_up_server_is_chosen() -> None:
    a = Candidate("http://a:8080", load(backlog_s=2.0, busy=2))
    b = Candidate("http://b:8080", load(backlog_s=0.5, busy=2))
    down = Candidate("http://c:8080", None)
    assert choose([a, b, down], budget_s=3.0) == b
    assert choose([a, down], budget_s=3.0) == a
    # with admission off, the least loaded takes it whatever its load
    assert choose([a], budget_s=None) == a
    assert isinstance(choose([a], budget_s=2.0), Refusal)


def test_no_server_up_is_unavailable_not_overloaded() -> None:
    refused = choose([Candidate("http://a:8080", None)], budget_s=3.0)
    assert isinstance(refused, Refusal)
    assert refused.code == "tts_unavailable"
    assert choose([], budget_s=None) == refused


def test_a_server_whose_real_time_capacity_is_in_use_takes_no_more_replies() -> None:
    full = dataclasses.replace(load(), realtime_streams=2.4)  # room for 2 replies at once
    assert refusal(full, budget_s=3.0, asks=replies(1)) is None
    refused = refusal(full, budget_s=3.0, asks=replies(2))
    assert refused is not None
    assert refused.reason == "2 replies in progress use all of its real-time capacity (2)"
    assert refused.deferrable  # one may end in a moment
    # replies synthesize ahead of their playback and overlap only in part: 1.6 streams (one
    # worker on all cores) carry two replies at once, not one
    serial = dataclasses.replace(load(workers=1), realtime_streams=1.6)
    assert refusal(serial, budget_s=3.0, asks=replies(1)) is None
    assert refusal(serial, budget_s=3.0, asks=replies(2)) is not None
    # routing prefers the server with the most room
    a = Candidate("http://a:8080", dataclasses.replace(load(), realtime_streams=4.0), replies(3))
    b = Candidate("http://b:8080", dataclasses.replace(load(), realtime_streams=4.0), replies(1))
    assert choose([a, b], budget_s=3.0) == b


def test_a_reply_joining_others_slows_what_they_have_left() -> None:
    # a 60-phoneme segment: 1.3 s alone, 1.95 s beside another
    shared = side_by_side(load())
    assert shared.slowdown(0) == 1.0  # nothing in progress to slow
    assert shared.slowdown(1) == pytest.approx(1.5)  # alone on both cores, then side by side
    assert shared.slowdown(2) == pytest.approx(1.5)  # 3 replies take turns for 2 workers
    assert load().slowdown(1) == 1.0  # an older server: speeds side by side unknown
    one_worker = load(workers=1)
    assert one_worker.slowdown(1) == pytest.approx(2.0)  # two replies take turns
    assert one_worker.slowdown(2) == pytest.approx(1.5)


def test_on_a_server_that_batches_a_reply_joining_others_slows_them_less() -> None:
    """Its decoder steps share the others' batches (`batch_curve`): a 60-phoneme segment (1.3
    s, 3.9 s of speech) has 0.624 s of decoder steps alone (4 ms a frame), 0.55 of it in a
    batch of two (4.4 ms a frame of both rows), so two replies taking turns on one worker take
    2 x 1.019 s, not 2 x 1.3."""
    batching = dataclasses.replace(load(workers=1), batch_curve={"1": 0.004, "2": 0.0044})
    assert batching.slowdown(0) == 1.0
    each = 1.3 - 0.624 * (1 - 0.0044 / 2 / 0.004)
    assert batching.slowdown(1) == pytest.approx(2 * each / 1.3)
    assert batching.slowdown(2) == pytest.approx(1.5)  # 3 rows read as 2's: no more gain
    # a curve whose batches cost more than their rows alone (this CPU's): no gain counted
    losing = dataclasses.replace(load(workers=1), batch_curve={"1": 0.0052, "2": 0.0138})
    assert losing.slowdown(1) == pytest.approx(2.0)


def test_replies_in_progress_without_the_spare_time_a_new_start_costs_refuse_it() -> None:
    shared = side_by_side(load())
    # the new first chunk takes 1.0 s / 2 workers from it, and the 6.2 s it has left to
    # synthesize runs half as long again: 0.5 + 3.1 s
    refused = refusal(shared, budget_s=3.0, asks=under_way((0.4, 6.2)))
    assert refused is not None
    assert refused.code == "overloaded"
    assert refused.reason == (
        "replies in progress would fall behind their listeners "
        "(spare 0.40 s, a new reply takes 3.60 s of it)"
    )
    assert refused.retry_after_s == 7  # when that reply has synthesized all it knows
    assert refused.deferrable
    # the same spare time is enough near the end of a reply, not in the middle of it
    assert refusal(shared, budget_s=3.0, asks=under_way((1.2, 1.0))) is None
    assert refusal(shared, budget_s=3.0, asks=under_way((1.2, 2.0))) is not None
    assert refusal(shared, budget_s=3.0, asks=replies(1)) is None  # nothing left to do
    # each chunk to come is asked on its own: one due soon is delayed by the new start and the
    # slowdown of the little synthesis before it, one at the end by all of it; the playback
    # buffer of a reply synthesizing ahead grows meanwhile, so its later chunks have more room
    profile = ((0.8, 0.4), (2.0, 2.4), (4.0, 6.2))  # 0.5 + 0.2, 0.5 + 1.2, 0.5 + 3.1 s needed
    assert refusal(shared, budget_s=3.0, asks=under_way(*profile)) is None
    late = refusal(shared, budget_s=3.0, asks=under_way((0.8, 0.4), (1.6, 2.4), (4.0, 6.2)))
    assert late is not None
    assert late.reason.endswith("(spare 1.60 s, a new reply takes 1.70 s of it)")
    assert late.retry_after_s == 7  # when it has synthesized all it knows
    # every reply in progress must have room, not only the one with the least spare time
    two = under_way((3.0, 1.0)) + under_way((1.4, 4.0))
    assert refusal(dataclasses.replace(shared, realtime_streams=3.0), 3.0, two) is not None
    # a reply just starting may wait 1 s for its first chunk, but has a typical reply ahead of
    # it (6 calls and 230 phonemes side by side: 7.8 s here), half as long again beside a new one
    assert shared.reply_s == pytest.approx(6 * 0.15 + 0.03 * 230)
    starting = refusal(shared, budget_s=3.0, asks=(Ask(),))
    assert starting is not None
    assert starting.reason.endswith("(spare 1.00 s, a new reply takes 4.40 s of it)")
    assert starting.retry_after_s == 8


def test_at_a_gpus_speed_replies_starting_together_are_all_taken() -> None:
    """Kokoro-82M on one H200 (docs/measured.md): 40 ms + 0.37 ms per phoneme a call alone, 15 %
    slower beside others, on 4 workers. A typical reply is 0.4 s of synthesis, so sixteen replies
    starting or under way leave room for one more; at 2 cores' speed one starting reply does not."""
    gpu = LoadReport(4, 2, 0, 0.05, None, 0.04, 0.00037, 60.0, 0.046, 0.000426)
    assert gpu.reply_s == pytest.approx(6 * 0.046 + 0.000426 * 230)
    asks = under_way((1.0, 0.3)) * 8 + (Ask(),) * 8
    assert refusal(gpu, budget_s=3.0, asks=asks) is None
    cpu = side_by_side(load(workers=4))
    assert refusal(cpu, budget_s=3.0, asks=(Ask(),)) is not None


def test_routing_skips_a_server_whose_replies_have_no_spare_time() -> None:
    tight = Candidate("http://a:8080", load(), under_way((0.1, 3.0)))
    roomy = Candidate("http://b:8080", load(backlog_s=0.5), under_way((2.0, 1.0)))
    assert choose([tight, roomy], budget_s=3.0) == roomy
    both_tight = dataclasses.replace(roomy, asks=under_way((0.2, 9.0)))
    refused = choose([tight, both_tight], budget_s=3.0)
    assert isinstance(refused, Refusal)
    assert refused.retry_after_s == 3  # the least loaded one's


def test_a_refusal_time_may_clear_is_given_before_one_it_cannot() -> None:
    # the server with the most room is past the budget (waiting cannot help); the other has a
    # reply in progress without spare time (waiting may): the pool should wait for that one
    backlogged = dataclasses.replace(load(backlog_s=4.5, busy=2), realtime_streams=4.0)
    a = Candidate("http://a:8080", backlogged)
    b = Candidate("http://b:8080", load(), under_way((0.1, 3.0)))
    refused = choose([a, b], budget_s=3.0)
    assert isinstance(refused, Refusal)
    assert refused.deferrable
    assert refused.reason.startswith("replies in progress would fall behind their listeners")
    only_backlogged = choose([a], budget_s=3.0)
    assert isinstance(only_backlogged, Refusal)
    assert not only_backlogged.deferrable
