"""The playback-aware chunk plan (`gateway.chunk_plan`) and the chunker's first cut: literal
texts and timelines in, cuts and deadlines out. No clock, no server."""

from __future__ import annotations

import pytest

from gateway.chunk_plan import Chunk, ChunkPlan, PlanConfig, SpeechRate
from gateway.chunker import ChunkerConfig, IncrementalSentenceChunker
from gateway.sources.echo import tokens
from kokoro_contract.speed import SpeedModel

ANSWER = (
    "Sure, I can help you with that right away. Your order shipped yesterday from our "
    "warehouse in Portland. It should arrive by Thursday afternoon. You will get a tracking "
    "link by email within the hour. Is there anything else I can do for you today?"
)


def fixed_speed(a: float = 0.35, b: float = 0.025) -> SpeedModel:
    """A speed model that has seen nothing else: it answers its prior."""
    return SpeedModel(prior_a=a, prior_b=b)


def plan_of(config: PlanConfig | None = None, speed: SpeedModel | None = None) -> ChunkPlan:
    """A plan whose estimates are fixed: 0.35 s + 25 ms per character, 14 characters a second."""
    return ChunkPlan(config or PlanConfig(), speed or fixed_speed(), SpeechRate(14.0, weight=0))


def paced(
    plan: ChunkPlan, text: str, start: float = 0.3, step: float = 0.025
) -> list[tuple[float, Chunk]]:
    """Feed `text` one token per `step` seconds, like an LLM at 40 tokens/s, then flush, and
    tick the plan whenever it asks (as the reply's feed loop does) until every chunk is out."""
    out: list[tuple[float, Chunk]] = []

    def ticks_until(now: float) -> None:
        while (wake := plan.wake_at()) is not None and wake <= now:
            out.extend((wake, c) for c in plan.tick(wake))

    now = start
    for token in tokens(text):
        ticks_until(now)
        out.extend((now, c) for c in plan.push(token, now))
        now += step
    ticks_until(now)
    out.extend((now, c) for c in plan.flush(now))
    ticks_until(float("inf"))
    return out


def finish(plan: ChunkPlan, now: float) -> list[Chunk]:
    """The end of the text at `now`, then every tick the plan asks for."""
    out = plan.flush(now)
    while (wake := plan.wake_at()) is not None:
        out += plan.tick(max(now, wake))
    return out


# --- the first cut --------------------------------------------------------------------------


def chunk_all(config: ChunkerConfig, text: str) -> list[str]:
    chunker = IncrementalSentenceChunker(config)
    out: list[str] = []
    for token in tokens(text):
        out += chunker.push(token)
    return out + chunker.flush()


def test_without_a_clause_the_old_first_cut_falls_mid_phrase() -> None:
    assert chunk_all(ChunkerConfig(), ANSWER)[0] == "Sure, I can help you with that right"


def test_the_first_cut_waits_for_the_sentence_end_or_a_phrase() -> None:
    config = ChunkerConfig(first_wait_words=16, merge_below_chars=0)
    assert chunk_all(config, ANSWER)[0] == "Sure, I can help you with that right away."
    text = "Our team will look into the whole matter and call you back within a day or two."
    assert chunk_all(config, text)[:2] == [
        "Our team will look into the whole matter",  # before "and", past 8 words
        "and call you back within a day or two.",
    ]


def test_at_the_wait_limit_the_cut_goes_before_the_last_phrase_start() -> None:
    config = ChunkerConfig(first_max_words=8, first_wait_words=10, merge_below_chars=0)
    text = "Yes I think we can probably manage with that plan quite easily really soon now."
    # no phrase start past word 8 and no punctuation by word 10: back to before "with"
    assert chunk_all(config, text)[0] == "Yes I think we can probably manage"


@pytest.mark.parametrize("step", [1, 2, 3, 7])
def test_the_first_cut_does_not_depend_on_how_the_text_was_split(step: int) -> None:
    config = ChunkerConfig(first_wait_words=12, merge_below_chars=0)
    text = "Our team will look into the matter and call you back. Thanks for waiting."
    chunker = IncrementalSentenceChunker(config)
    out: list[str] = []
    for i in range(0, len(text), step):
        out += chunker.push(text[i : i + step])
    assert out + chunker.flush() == chunk_all(config, text)


def test_slow_text_is_cut_on_a_timer_at_the_best_place_so_far() -> None:
    plan = plan_of(PlanConfig(first_wait_s=0.6))
    assert plan.push("Well, let me see what ", 1.0) == []
    assert plan.push("I ", 1.4) == []
    assert plan.wake_at() == pytest.approx(1.6)
    assert plan.tick(1.59) == []
    (first,) = plan.tick(1.6)
    assert first.text == "Well, let me see what I"  # every word so far is whole
    assert first.deadline_ms == pytest.approx((0.35 + 0.025 * 23 + 1.0) * 1000)
    plan2 = plan_of(PlanConfig(first_wait_s=0.6))
    plan2.push("Well, let me see what I thi", 1.0)
    (cut,) = plan2.tick(1.6)
    assert cut.text == "Well, let me see what I"  # "thi" may still grow
    assert [c.text for c in finish(plan2, 1.7)] == ["thi"]


# --- the plan -----------------------------------------------------------------------------------


def test_chunks_grow_with_the_listeners_buffer() -> None:
    sent = paced(plan_of(), ANSWER)
    texts = [c.text for _, c in sent]
    assert texts == [
        "Sure, I can help you with that right away.",
        "Your order shipped yesterday from our warehouse in Portland.",
        "It should arrive by Thursday afternoon. You will get a tracking link by email within "
        "the hour. Is there anything else I can do for you today?",
    ]
    assert " ".join(texts) == ANSWER
    # the first is needed at once; each later one when the audio before it runs out
    (t0, first), (t1, second), (t2, third) = sent
    assert t0 == pytest.approx(0.525)
    # needed when it could be ready, plus the slack a new reply gives replies in progress
    assert first.deadline_ms == pytest.approx((0.35 + 0.025 * 42 + 1.0) * 1000)
    play = 0.525 + 0.35 + 0.025 * 42  # the first chunk's estimated synthesis
    assert second.deadline_ms == pytest.approx((play + 42 / 14 - t1) * 1000)
    assert third.deadline_ms == pytest.approx((play + (42 + 60) / 14 - t2) * 1000)


def test_each_chunk_fits_before_its_deadline() -> None:
    speed = fixed_speed()
    config = PlanConfig()
    sent = paced(plan_of(config, speed), ANSWER)
    busy = 0.0
    for when, chunk in sent[1:]:
        start = max(when, busy)
        busy = start + speed.estimate(len(chunk.text))
        assert busy + config.margin_s <= when + chunk.deadline_ms / 1000 + 1e-9


def test_a_slower_engine_gets_smaller_chunks() -> None:
    fast = [c.text for _, c in paced(plan_of(speed=fixed_speed(b=0.01)), ANSWER)]
    slow = [c.text for _, c in paced(plan_of(speed=fixed_speed(b=0.04)), ANSWER)]
    assert len(fast) < len(slow)
    assert " ".join(fast) == " ".join(slow) == ANSWER


def test_later_text_waits_while_the_engine_is_busy_then_goes() -> None:
    plan = plan_of()
    (first,) = plan.push("Hello there, how are you today? I am fine. ", 0.0)
    assert first.text == "Hello there, how are you today?"
    busy_until = 0.35 + 0.025 * len(first.text)
    assert plan.push("Thanks. Bye", 0.2) == []  # two sentences held: more may join them
    assert plan.wake_at() == pytest.approx(busy_until - PlanConfig().lead_s)
    (second,) = plan.tick(busy_until - PlanConfig().lead_s)
    assert second.text == "I am fine. Thanks."
    assert plan.flush(busy_until) == []  # the engine is busy with the second chunk
    assert [c.text for c in finish(plan, busy_until)] == ["Bye"]


def test_what_the_model_server_reports_corrects_the_timeline() -> None:
    plan = plan_of()
    plan.push("Hello there, how are you today? I am fine. ", 0.0)  # the first goes at once
    plan.audio_started(3.0)  # much later than estimated
    plan.completed(0, audio_s=2.0, now=3.0)
    (second,) = plan.flush(3.0)
    assert second.text == "I am fine."
    assert second.deadline_ms == pytest.approx(2000.0)  # plays once the 2 s before it ran out


def test_nothing_before_text_and_nothing_after_the_end() -> None:
    plan = plan_of()
    assert plan.wake_at() is None
    assert plan.flush(0.0) == []
    assert plan.wake_at() is None


def test_a_sentence_too_long_for_its_deadline_is_cut_before_a_phrase() -> None:
    slow = plan_of(speed=fixed_speed(a=0.35, b=0.06))  # 60 ms a character
    texts = [c.text for _, c in paced(slow, ANSWER)]
    assert texts[:3] == [
        "Sure, I can help you with that right away.",
        # all of the next sentence would be late: its first phrase goes first
        "Your order shipped yesterday",
        "from our warehouse in Portland.",
    ]
    assert " ".join(texts) == ANSWER
