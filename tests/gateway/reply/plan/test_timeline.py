"""A playback plan's timeline (`gateway.reply.plan.timeline`): literal chunks and literal rates in,
literal times out; the one computation every question of the plan reads, and when it holds."""

from __future__ import annotations

import math

import pytest

from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.rates import Rates
from gateway.reply.plan.timeline import (
    Inputs,
    Sent,
    Slot,
    build,
    cut,
    rest_spare,
    spare,
    spoken_chars,
    window_spans,
)

CONFIG = PlanConfig()
# 0.35 s + 25 ms a character of synthesis, 14 characters spoken a second; a chunk's audio all
# at once with its first (an engine whose unit is the chunk)
WHOLE = Rates(synth=(0.35, 0.025), first=None, spoken_per_s=14.0, early_s=None)
# the same speed, but the first audio 0.25 s after a chunk starts, holding 0.6 s of audio
PROGRESSIVE = Rates(synth=(0.35, 0.025), first=(0.25, 0.0), spoken_per_s=14.0, early_s=0.6)


def times(slot: Slot) -> list[float]:
    """When its synthesis starts, its first audio is ready, its synthesis ends; how long it
    plays; its synthesis to its first audio."""
    return [slot.start, slot.first, slot.finish, slot.audio_s, slot.first_s]


TWO_SENTENCES = (
    "with that right away.",
    "Your order shipped yesterday from our warehouse in Portland.",
)


def test_a_progressive_chunk_is_expected_in_windows_that_double() -> None:
    # a first window of 0.6 s, then 1.2, 2.4, 4.8 (the largest), 4.8, and the 2.2 s left
    ends = [end for _, end in window_spans(16.0, 0.6, 4.8)]
    assert ends == pytest.approx([0.6, 1.8, 4.2, 9.0, 13.8, 16.0])
    # what is left after a window, when shorter than the first, goes into it
    assert [end for _, end in window_spans(1.43, 0.6, 4.8)] == pytest.approx([0.6, 1.43])
    assert window_spans(1.0, 0.6, 4.8) == [(0.0, 1.0)]
    assert window_spans(2.0, 5.0, 4.8) == [(0.0, 2.0)]  # a first frame with all of it


def test_a_chunk_on_the_timeline_is_ready_window_by_window() -> None:
    # 60 characters: 4.29 s of audio, its synthesis 0.35 + 1.5 s, its first audio at 0.25 s
    slot = Slot.at(60, 0.0, PROGRESSIVE, CONFIG)
    assert (slot.start, slot.first, slot.finish) == (0.0, 0.25, 1.85)
    assert slot.audio_s == pytest.approx(60 / 14)
    # windows of 0.6 s, then 1.2 s, then the 2.49 s left: the 1.6 s after the first audio
    # spread over the 3.69 s of audio after the first window
    windows = [x for window in slot.windows for x in (window.begin, window.done)]
    assert windows == pytest.approx([0.6, 1.6 * 1.2 / (60 / 14 - 0.6), 1.8, 1.6])
    assert slot.ready == pytest.approx((0.25, 0.25 + 1.6 * 1.2 / (60 / 14 - 0.6), 1.85))
    # played from 0.8 s: its first audio has 0.0875 s to spare (0.4 s plus a quarter of its
    # 0.25 s of margin), its last window none: -0.05 s (0.4 s plus a quarter of its 1.6 s);
    # with the margin of a first audio already here (0.1 s), 0.25 s
    assert spare(slot, 0.8, CONFIG) == pytest.approx(-0.05)
    assert rest_spare(slot, 0.8, CONFIG) == pytest.approx(-0.05)
    assert rest_spare(slot, 0.8, CONFIG, fixed=0.1) == pytest.approx(0.25)
    # all of it with its first audio: one window, nothing after it can be late
    whole = Slot.at(60, 0.0, WHOLE, CONFIG)
    assert (whole.first, whole.finish, whole.windows, whole.ready) == (1.85, 1.85, (), (1.85,))
    assert rest_spare(whole, 0.8, CONFIG) == math.inf


def test_the_timeline_of_a_first_chunk_done_and_two_sentences_waiting() -> None:
    # "Sure, I can help you" (20 characters) sent at 0, done at 0.85 with 1.2 s of audio
    sent = (Sent(20, 0.0, 0.0, 0.85, 0.85, 1.2, done=True),)
    timeline = build(Inputs(sent, TWO_SENTENCES, WHOLE, CONFIG, False, None), 0.85)
    assert timeline.sent == (Slot(20, 0.0, 0.85, 0.85, 1.2, 0.85, (), done=True),)
    assert (timeline.busy_until, timeline.free) == (0.85, 0.85)
    # the hold: "with that right away." (0.875 s) is ready at 1.725 and must be 0.4 s plus a
    # quarter of its synthesis before the first chunk's 1.2 s run out: from 1.144 s on, in
    # steps of 50 ms
    assert timeline.play_start == pytest.approx(1.15)
    assert timeline.plays_at == (timeline.play_start,)
    assert timeline.runs_out == pytest.approx(2.35)
    # the text not sent as it would go: the second sentence whole would be late, so it is cut
    # before "from", and its rest follows
    planned = timeline.planned
    assert [(p.text, p.rest, p.slot.chars, p.slot.windows) for p in planned] == [
        ("with that right away.", None, 21, ()),
        ("Your order shipped yesterday", "from our warehouse in Portland.", 28, ()),
        ("from our warehouse in Portland.", None, 31, ()),
    ]
    assert [[*times(p.slot), p.needed] for p in planned] == [
        pytest.approx([0.85, 1.725, 1.725, 1.5, 0.875, 2.35]),
        pytest.approx([1.725, 2.775, 2.775, 2.0, 1.05, 3.85]),
        pytest.approx([2.775, 3.9, 3.9, 31 / 14, 1.125, 5.85]),
    ]
    assert timeline.waiting_synth_s == pytest.approx(0.875 + 1.85)  # each sentence whole
    assert timeline.done_in_s(0.85) == pytest.approx(2.725)
    # before playback: how much further its start may slide (the hold's limit is 1 s)
    ((slide, synthesis),) = timeline.spare_profile(0.85)
    assert (slide, synthesis) == pytest.approx((0.85 + 1.0 - 1.15, 2.725))
    assert timeline.fits(21)  # "with that right away." sent next is in time
    assert not timeline.fits(21 + 1 + 60)  # with the next sentence, it is not


def test_the_hold_ends_where_playback_keeps_up_or_at_the_limit() -> None:
    sent = (Sent(20, 0.0, 0.0, 0.85, 0.85, 1.2, done=True),)
    alone = build(Inputs(sent, (), WHOLE, CONFIG, False, None), 0.85)
    assert alone.play_start == 0.85  # nothing follows: played as soon as it is ready
    short = PlanConfig(first_hold_s=0.1)
    held = build(Inputs(sent, TWO_SENTENCES, WHOLE, short, False, None), 0.85)
    assert held.play_start == pytest.approx(0.95)  # would keep up at 1.15: held to the limit
    started = build(Inputs(sent, TWO_SENTENCES, WHOLE, CONFIG, False, 0.9), 0.9)
    assert started.play_start == 0.9  # playback started: no hold to compute
    assert started.planned[0].needed == pytest.approx(2.1)
    nothing = build(Inputs((), ("Hello there.",), WHOLE, CONFIG, False, None), 2.0)
    assert (nothing.play_start, nothing.runs_out, nothing.planned) == (math.inf, math.inf, ())
    # not started: its first chunk is one call more
    assert nothing.done_in_s(2.0) == pytest.approx(0.35 + 0.3 + 0.35)
    ((spare_s, synthesis),) = nothing.spare_profile(2.0)
    assert (spare_s, synthesis) == pytest.approx((0.0, 1.0))


def test_what_a_chunk_has_to_spare_counts_from_now() -> None:
    """Admission's question, while playing: a chunk estimated done before now, not reported,
    is ready no sooner than now, and the text not sent follows it, a sentence each."""
    sent = (
        Sent(14, 0.0, 0.0, 0.7, 0.7, 1.0, done=True),
        Sent(21, 0.5, 0.5, 1.2, 1.2, 1.5),  # estimated at 1.2, not reported at 1.5
    )
    timeline = build(Inputs(sent, ("Thanks.",), WHOLE, CONFIG, True, 0.0), 1.5)
    assert timeline.plays_at == (0.0, 1.0)
    # the second, needed at 1.0, ready at 1.5 at the soonest, should have been 0.4 s plus a
    # quarter of its 0.875 s before; "Thanks." (0.525 s) from 1.5, needed at 2.5
    profile = [x for chunk in timeline.spare_profile(1.5) for x in chunk]
    second, thanks = 1.0 - 1.5 - (0.4 + 0.25 * 0.875), 2.5 - 2.025 - (0.4 + 0.25 * 0.525)
    assert profile == pytest.approx([second, 0.0, thanks, 0.525])


def test_a_timeline_holds_while_the_moment_does_not_move_it() -> None:
    """The moment counts only as when the engine is free for the text not sent: while the
    engine is busy with the chunks sent, or no text waits, one timeline answers at every
    moment; past the estimate with text waiting, each moment has its own."""
    sent = (Sent(20, 0.0, 0.0, 0.25, 1.85, 60 / 14),)
    inputs = Inputs(sent, TWO_SENTENCES, PROGRESSIVE, CONFIG, True, None)
    timeline = build(inputs, 0.3)
    assert timeline.free == 1.85
    assert timeline.holds(inputs, 1.0)
    assert timeline.holds(inputs, 1.85)
    assert build(inputs, 1.0) == timeline  # a value: the same inputs give the same timeline
    assert not timeline.holds(inputs, 1.9)  # the engine free at 1.9, not at 1.85
    assert build(inputs, 1.9).free == 1.9
    moved = Inputs(sent, TWO_SENTENCES[:1], PROGRESSIVE, CONFIG, True, None)
    assert not timeline.holds(moved, 1.0)  # any input changed
    quiet = Inputs(sent, (), PROGRESSIVE, CONFIG, True, None)
    assert build(quiet, 0.3).holds(quiet, 9.0)  # no text waits: nothing depends on the moment


def test_a_sentence_too_long_for_its_deadline_is_cut_at_a_phrase_in_any_script() -> None:
    english = (
        "Your order left our warehouse in Portland yesterday, and it is on its way to you now."
    )
    japanese = "ご注文の品は昨日、ポートランドの倉庫から発送されました。"
    # time for all of either: whole
    assert cut(english, 0.0, 60.0, WHOLE, CONFIG) == (english, None)
    assert cut(japanese, 0.0, 60.0, WHOLE, CONFIG) == (japanese, None)
    # not: before a phrase, or after a Japanese clause mark (no spaces to cut at)
    assert cut(english, 0.0, 2.6, WHOLE, CONFIG) == (
        "Your order left our warehouse in Portland yesterday,",
        "and it is on its way to you now.",
    )
    assert cut(japanese, 0.0, 2.6, WHOLE, CONFIG) == (
        "ご注文の品は昨日、",
        "ポートランドの倉庫から発送されました。",
    )
    # a CJK character counts as the 2.5 letters of English it takes to say
    assert spoken_chars(japanese) == round(28 * 2.5)
    assert spoken_chars(english) == len(english)
