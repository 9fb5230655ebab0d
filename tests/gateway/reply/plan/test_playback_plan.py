"""The playback-aware chunk plan (`gateway.reply.plan.playback_plan`) and the chunker's first cut:
literal texts and timelines in, cuts and deadlines out. No clock, no server."""

from __future__ import annotations

import pytest

from gateway.reply.chunker import ChunkerConfig, IncrementalSentenceChunker
from gateway.reply.plan import playback_plan
from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.reply.plan.protocol import UNFINISHED_MAX, Chunk, Plan
from gateway.reply.plan.rates import FIRST_WINDOW_AUDIO_S, EarlyAudio, SpeechRate
from gateway.reply.plan.timeline import Inputs, Timeline, build
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
    tick the plan whenever it asks (as the reply's feed loop does) until every chunk is out.
    The model server keeps to the plan's estimates: it synthesizes the chunks one after
    another, each as fast and as long as estimated, and reports each done (its
    `synthesis_complete`) when its synthesis ends; the first audio is ready when estimated,
    and playback starts when the plan releases it. The plan hears of each as a reply tells it
    (`completed`, then a tick; `audio_ready`; `audio_started`)."""
    out: list[tuple[float, Chunk]] = []
    done_at: list[float] = []  # when each chunk sent is synthesized
    reported: list[float] = []  # when each chunk done so far was reported
    first_ready: list[float] = []  # when the first chunk's first audio is ready
    started = False
    clock = 0.0

    def took(now: float, chunks: list[Chunk]) -> None:
        for chunk in chunks:
            begin = max(now, done_at[-1]) if done_at else now
            chars = len(chunk.text)
            if not done_at:
                first_s = plan.speed.estimate(chars)
                if plan.first_speed is not None and plan.early and plan.early.seconds is not None:
                    first_s = min(first_s, plan.first_speed.estimate(chars))
                first_ready.append(begin + first_s)
            done_at.append(begin + plan.speed.estimate(chars))
            out.append((now, chunk))

    def next_event() -> float:
        times = [float("inf")]
        if (wake := plan.wake_at()) is not None:
            times.append(wake)
        if len(reported) < len(done_at):
            times.append(done_at[len(reported)])
        if first_ready and not started:
            ready = max(first_ready[0], clock)
            release = plan.release_at(ready) if clock >= first_ready[0] else None
            times.append(ready if release is None else max(release, ready))
        return min(times)

    def ticks_until(now: float) -> None:
        nonlocal started, clock
        while (at := next_event()) <= now and at != float("inf"):
            if first_ready and not started and first_ready[0] <= at:
                if clock < first_ready[0]:
                    plan.audio_ready(first_ready[0])
                if (release := plan.release_at(at)) is not None and release <= at + 1e-9:
                    plan.audio_started(at)
                    started = True
            clock = at
            while len(reported) < len(done_at) and done_at[len(reported)] <= at:
                index = len(reported)
                chars = len(out[index][1].text)
                plan.completed(index, chars / (plan.speech.chars_per_s * plan.speed_factor), at)
                reported.append(at)
            took(at, plan.tick(at))

    now = start
    for token in tokens(text):
        ticks_until(now)
        took(now, plan.push(token, now))
        now += step
    ticks_until(now)
    took(now, plan.flush(now))
    ticks_until(float("inf"))
    assert not plan.unsent
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
        "Sure, I can help you",  # five words, then a phrase starts: out early
        "with that right away.",
        "Your order shipped yesterday",  # the buffer is thin: the first phrase first
        "from our warehouse in Portland. It should arrive by Thursday afternoon.",
        # the two last would fit their deadline together, but not under max_group_s (2.5 s)
        "You will get a tracking link by email within the hour.",
        "Is there anything else I can do for you today?",
    ]
    assert " ".join(texts) == ANSWER
    assert fixed_speed().estimate(len(" ".join(texts[-2:]))) > PlanConfig().max_group_s
    (t0, first), (t1, second), *_ = sent
    assert t0 == pytest.approx(0.425)
    # needed when it could be ready, plus the slack a new reply gives replies in progress
    assert first.deadline_ms == pytest.approx((0.35 + 0.025 * 20 + 1.0) * 1000)
    # the second is needed when the first has played from the planned start of playback:
    # the second (0.875 s from when the first is ready) must be ready 0.4 s plus a quarter of
    # its synthesis before the first's 20 / 14 s run out: playback starts 65 ms after the
    # first is ready, in steps of 50 ms: 100 ms
    ready = t0 + 0.35 + 0.025 * 20
    assert second.deadline_ms == pytest.approx((ready + 0.1 + 20 / 14 - t1) * 1000)


def test_the_first_audio_is_held_until_what_follows_can_keep_up() -> None:
    plan = plan_of()
    (first,) = plan.push(
        "Sure, I can help you with that right away. Your order shipped yesterday from our "
        "warehouse in Portland. ",
        0.0,
    )
    assert first.text == "Sure, I can help you"
    plan.completed(0, audio_s=1.2, now=0.85)
    # "with that right away." is ready at 0.85 + 0.875 and must be 0.4 s plus a quarter of
    # its 0.875 s before the first chunk's 1.2 s run out: from 1.144 s on, in steps of 50 ms;
    # the next sentence fits behind it once cut before "from"
    assert plan.release_at(0.85) == pytest.approx(1.15)
    plan.audio_started(1.15)
    assert plan.release_at(1.0) is None  # playing: nothing more is held


def test_a_first_audio_is_held_no_longer_than_first_hold_s() -> None:
    plan = plan_of(PlanConfig(first_hold_s=0.5), speed=fixed_speed(b=0.2))  # a slow engine
    plan.push("Sure, I can help you with that right away. Thanks. ", 0.0)
    plan.completed(0, audio_s=1.2, now=4.35)
    assert plan.release_at(4.35) == pytest.approx(4.85)
    unheld = plan_of(PlanConfig(first_hold_s=0.0), speed=fixed_speed(b=0.2))
    unheld.push("Sure, I can help you with that right away. Thanks. ", 0.0)
    unheld.completed(0, audio_s=1.2, now=4.35)
    assert unheld.release_at(4.35) == pytest.approx(4.35)


def test_a_reply_alone_needs_no_hold() -> None:
    plan = plan_of()
    plan.push("Hello there.", 0.0)
    assert [c.text for c in plan.flush(0.1)] == ["Hello there."]
    plan.completed(0, audio_s=1.0, now=0.65)
    assert plan.release_at(0.65) == pytest.approx(0.65)


def test_spare_time_is_what_a_new_reply_may_take_without_a_gap() -> None:
    plan = plan_of()
    # asked, nothing sent yet: about to need the engine
    assert [spare for spare, _ in plan.spare_profile(0.0)] == [0.0]
    plan.push("Sure, I can help you with that right away. It should arrive by Thursday. Bye", 0.0)
    assert plan.spare_profile(0.1) != ()
    plan.completed(0, audio_s=1.2, now=0.85)
    # before playback: how much further its start may slide
    start = plan.release_at(0.85)
    assert start is not None
    ((slide, _),) = plan.spare_profile(0.85)
    assert slide == pytest.approx(0.85 + 1.0 - start)
    plan.audio_started(0.95)
    (second,) = plan.tick(0.95)
    assert second.text == "with that right away."
    # playing from 0.95 with 1.2 s of audio: the second (0.875 s from 0.95) is needed at
    # 2.15; the third after it, needed when the second's 21 / 14 s ran out; each should be
    # ready 0.4 s plus a quarter of its synthesis before
    third = len("It should arrive by Thursday.")
    third_synth = 0.35 + 0.025 * third
    third_ready = 0.95 + 0.875 + third_synth
    second_spare = 2.15 - 1.825 - (0.4 + 0.25 * 0.875)
    third_spare = 2.15 + 21 / 14 - third_ready - (0.4 + 0.25 * third_synth)
    # chunk by chunk, with the synthesis from now until each is done: what admission asks
    profile = [x for chunk in plan.spare_profile(0.95) for x in chunk]
    assert profile == pytest.approx([second_spare, 1.825 - 0.95, third_spare, third_ready - 0.95])
    assert plan.done_in_s(0.95) == pytest.approx(third_ready - 0.95)  # ("Bye" may go on)
    plan.completed(1, audio_s=1.5, now=1.8)
    rest = [c.text for c in finish(plan, 1.8)]
    assert " ".join(rest) == "It should arrive by Thursday. Bye"
    for index in range(2, 2 + len(rest)):
        assert plan.spare_profile(2.0 + index) != ()  # still to come
        plan.completed(index, audio_s=1.0, now=2.0 + index)
    assert plan.spare_profile(9.0) == ()  # all of it synthesized


def test_each_chunk_fits_before_its_deadline() -> None:
    speed = fixed_speed()
    config = PlanConfig()
    sent = paced(plan_of(config, speed), ANSWER)
    busy = 0.0
    for when, chunk in sent[1:]:
        assert chunk.deadline_ms is not None
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


def test_an_engine_far_behind_the_estimate_gets_no_fifth_chunk_until_one_is_done() -> None:
    """The plan goes by its estimate, but never has more than `UNFINISHED_MAX` chunks at the
    model server unfinished: a session refuses requests past its limit. The rest of the text
    waits in the plan however late the reports are, and goes as chunks complete."""
    plan = plan_of()
    sent = [c.text for c in plan.push(ANSWER + " " + ANSWER, 0.0)]
    assert sent == ["Sure, I can help you"]
    for now in range(1, 60):  # estimates run out one after another; no report comes
        sent += [c.text for c in plan.tick(float(now))]
    assert len(sent) == UNFINISHED_MAX
    assert plan.wake_at() is None  # nothing to wait for but a report
    assert plan.unsent
    plan.completed(0, audio_s=1.4, now=60.0)
    assert plan.wake_at() is not None  # one may go, when its estimate says
    while (wake := plan.wake_at()) is not None:
        sent += [c.text for c in plan.tick(wake)]
    assert len(sent) == UNFINISHED_MAX + 1
    index = 1
    while plan.unsent:  # each report lets one more go
        plan.completed(index, audio_s=2.0, now=60.0 + index)
        sent += [c.text for c in finish(plan, 60.0 + index)]
        index += 1
    assert " ".join(sent) == ANSWER + " " + ANSWER
    assert plan.wake_at() is None


def test_the_playback_plan_is_its_own_playback() -> None:
    """What the reply's playback processor and admission ask of it (`Plan.playback`)."""
    plan = plan_of()
    asked: Plan = plan
    assert asked.playback is plan


# --- an engine that speaks progressively ------------------------------------------------------


def progressive_plan(speed: SpeedModel | None = None, early_s: float = 0.6) -> ChunkPlan:
    """The same plan over an engine whose first audio takes 0.25 s whatever the chunk (its
    front pass and first window) and holds `early_s` of audio, the rest coming by the end of
    the chunk's synthesis, at the same speed as `plan_of`'s."""
    first = SpeedModel(prior_a=0.25, prior_b=0.0)
    speech = SpeechRate(14.0, weight=0)
    return ChunkPlan(PlanConfig(), speed or fixed_speed(), speech, 1.0, first, EarlyAudio(early_s))


TWO_SENTENCES = (
    "Sure, I can help you with that right away. Your order shipped yesterday from our "
    "warehouse in Portland. "
)


def test_a_progressive_engine_holds_the_first_audio_only_for_what_its_first_frame_lacks() -> None:
    whole = plan_of()
    (first,) = whole.push(TWO_SENTENCES, 0.0)
    assert first.text == "Sure, I can help you"
    whole.completed(0, audio_s=1.2, now=0.85)
    assert whole.release_at(0.85) == pytest.approx(1.15)  # as above: all of it at 0.85
    # progressive: the first 0.6 s at 0.25, the rest by the chunk's end (0.85), which must be
    # there a margin before those 0.6 s have played: while the first audio is only expected,
    # 0.4 s (its start may be late by as much) and a quarter of the 0.6 s it took...
    progressive = progressive_plan()
    progressive.push(TWO_SENTENCES, 0.0)
    assert progressive.release_at(0.0) == pytest.approx(0.8)
    # ...and once it is here, the engine at work on the rest, 0.1 s (`ready_margin_s`)
    progressive.audio_ready(0.25)
    assert progressive.release_at(0.25) == pytest.approx(0.5)
    # a first frame that holds all the first chunk needs (a server whose windows keep ahead):
    # no hold at all, what follows is in time
    covered = progressive_plan(early_s=5.0)
    covered.push(TWO_SENTENCES, 0.0)
    covered.audio_ready(0.25)
    assert covered.release_at(0.25) == pytest.approx(0.25)


def test_a_progressive_engine_gets_fewer_calls_and_an_earlier_first_deadline() -> None:
    whole = [c for _, c in paced(plan_of(), ANSWER)]
    progressive = [c for _, c in paced(progressive_plan(), ANSWER)]
    assert " ".join(c.text for c in progressive) == ANSWER
    assert len(progressive) < len(whole)
    assert progressive[0].text == whole[0].text == "Sure, I can help you"  # as early
    # its first chunk is needed when its first audio can be ready (plus the slack)
    assert progressive[0].deadline_ms == pytest.approx((0.25 + 1.0) * 1000)
    # with no other reply on its server, no slack: it would only let a progressive server
    # open the chunk with a larger window, the first audio later
    alone = progressive_plan()
    alone.alone = True
    (first,) = alone.push(TWO_SENTENCES, 0.0)
    assert first.text == "Sure, I can help you"
    assert first.deadline_ms == pytest.approx(0.25 * 1000)
    # its windows double after the first (`window_spans`), so the sentences after the first
    # chunk keep ahead of playback as if its first frames held them whole: the same chunks,
    # three where the same engine speaking each chunk at once takes six
    covered = [c for _, c in paced(progressive_plan(early_s=30.0), ANSWER)]
    assert [c.text for c in covered] == [c.text for c in progressive]
    assert [c.text for c in progressive] == [
        "Sure, I can help you",
        "with that right away. Your order shipped yesterday from our warehouse in Portland. "
        "It should arrive by Thursday afternoon.",
        "You will get a tracking link by email within the hour. Is there anything else I can "
        "do for you today?",
    ]
    assert len(whole) == 6


def test_a_progressive_engine_slower_than_half_of_playback_gets_smaller_chunks() -> None:
    # 45 ms a character against 14 characters a second: 0.63 s of synthesis a second of
    # audio, slower than windows that double can follow from a short lead, so the chunks
    # after the first stay small while the listener's buffer grows
    fast = [c for _, c in paced(progressive_plan(), ANSWER)]
    slower = [c for _, c in paced(progressive_plan(fixed_speed(b=0.045)), ANSWER)]
    assert " ".join(c.text for c in slower) == ANSWER
    assert [len(c.text) for c in slower[1:4]] == [21, 28, 31]
    assert len(slower) > len(fast)


def test_under_load_the_hold_comes_back_for_a_progressive_engine() -> None:
    # synthesis slower than playback (0.35 s + 90 ms a character against 14 characters a
    # second): the first audio is early, but what follows it could not keep up
    plan = progressive_plan(fixed_speed(b=0.09), early_s=30.0)
    plan.push("Sure, I can help you with that right away. Thanks a lot for asking. ", 0.0)
    plan.audio_ready(0.25)
    assert plan.release_at(0.25) == pytest.approx(1.25)  # held as long as it may be


def test_what_a_progressive_server_shows_is_learned() -> None:
    first = SpeedModel(prior_a=0.35, prior_b=0.025)  # as if whole: the prior
    early = EarlyAudio()
    plan = ChunkPlan(PlanConfig(), fixed_speed(), SpeechRate(14.0, weight=0), 1.0, first, early)
    plan.push("Hello there, how are you today? I am fine. ", 0.0)
    assert first.estimate(40) == pytest.approx(fixed_speed().estimate(40))
    assert early.of(2.0) == 2.0  # nothing seen: a chunk's audio comes all at once
    plan.completed(0, audio_s=2.0, now=1.1, synth_s=1.1, first_s=0.2, early_s=2.0)
    assert early.seconds is None  # a first frame with all of it says nothing more
    assert first.estimate(31) < 0.5 * fixed_speed().estimate(31)
    (second,) = plan.flush(1.1)
    assert second.text == "I am fine."
    # a later chunk's first window is as large as its lead let the server make it: neither
    # its first audio's time nor its first frame is learned
    learned = first.estimate(31)
    plan.completed(1, audio_s=1.0, now=1.9, synth_s=0.8, first_s=0.7, early_s=0.6)
    assert early.seconds is None
    assert first.calls == 1
    assert first.estimate(31) == pytest.approx(learned)
    # the next reply's first chunk, whose first frame held 0.6 s of its 2 s, is
    after = ChunkPlan(PlanConfig(), fixed_speed(), SpeechRate(14.0, weight=0), 1.0, first, early)
    after.push("Hello there, how are you today? I am fine. ", 0.0)
    after.completed(0, audio_s=2.0, now=1.0, synth_s=1.0, first_s=0.2, early_s=0.6)
    assert early.seconds == pytest.approx(0.6)
    assert early.of(2.0) == pytest.approx(0.6)
    assert early.of(0.4) == 0.4  # a chunk shorter than a first frame: all of it


def test_a_server_that_says_it_speaks_progressively_is_planned_for_from_its_first_reply() -> None:
    told = EarlyAudio()
    told.assume()  # what the server's load report says (`Admitted.progressive`)
    assert told.seconds == FIRST_WINDOW_AUDIO_S
    first = SpeedModel(prior_a=0.25, prior_b=0.0)
    plan = ChunkPlan(PlanConfig(), fixed_speed(), SpeechRate(14.0, weight=0), 1.0, first, told)
    unknown = ChunkPlan(
        PlanConfig(), fixed_speed(), SpeechRate(14.0, weight=0), 1.0, first, EarlyAudio()
    )
    assert len([c for _, c in paced(plan, ANSWER)]) < len([c for _, c in paced(unknown, ANSWER)])
    told.observe(0.2, 2.0)  # then what its first chunks show
    assert told.seconds == pytest.approx(0.55 + 0.3 * (0.2 - 0.55))
    told.assume()  # and a later reply's report changes nothing learned
    assert told.seconds == pytest.approx(0.445)


# --- one timeline, computed when an input changes it ------------------------------------------


def counting_builds(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The moments at which the plans compute a timeline (`timeline.build`), from now on."""
    builds: list[float] = []

    def counted(inputs: Inputs, now: float) -> Timeline:
        builds.append(now)
        return build(inputs, now)

    monkeypatch.setattr(playback_plan, "build", counted)
    return builds


def test_an_audio_piece_computes_no_timeline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The playback processor asks the plan of every audio piece while it holds the first audio
    (`audio_ready`, then `release_at`): a piece that changes nothing reads the timeline computed
    before it. A report, or the shared speed moved by another reply's report, computes it
    again."""
    builds = counting_builds(monkeypatch)
    # synthesis slower than playback: the first audio is early, and held as long as it may be
    plan = progressive_plan(fixed_speed(b=0.09), early_s=30.0)
    plan.push("Sure, I can help you with that right away. Thanks a lot for asking. ", 0.0)
    plan.audio_ready(0.25)  # the first piece: the first audio is here, the rest by 2.15
    assert plan.release_at(0.25) == pytest.approx(1.25)
    timeline, computed = plan.timeline(0.25), len(builds)
    for piece in range(1, 40):  # the rest of the first window, 20 ms a piece
        now = 0.25 + 0.02 * piece
        plan.audio_ready(now)
        assert plan.release_at(now) == pytest.approx(1.25)
    assert len(builds) == computed
    assert plan.timeline(1.05) is timeline
    assert timeline.planned[0].slot.finish == pytest.approx(2.15 + 0.35 + 0.09 * 21)
    plan.speed.observe(40, 1.0)  # another reply's chunk: the shared speed is faster
    assert plan.release_at(1.05) == pytest.approx(1.25)  # the first chunk's rest is still late
    assert len(builds) == computed + 1
    a, b = plan.speed.line
    assert plan.timeline(1.05).planned[0].slot.finish == pytest.approx(2.15 + a + b * 21)
    plan.audio_ready(1.06)
    assert plan.release_at(1.06) == pytest.approx(1.25)
    assert len(builds) == computed + 1
    plan.completed(0, audio_s=1.4, now=1.1, synth_s=0.85)  # its own report: it is all here
    assert plan.release_at(1.1) == pytest.approx(0.45)  # and would have kept up from 0.45
    assert len(builds) == computed + 2


def test_past_the_estimate_with_text_waiting_the_moment_moves_the_hold() -> None:
    """Where the engine is estimated done with the chunks sent and text waits, that text's
    synthesis starts no sooner than now: the hold moves with the moment, and so does the
    timeline (the one computed before is not kept past it)."""
    plan = plan_of()
    (first,) = plan.push(TWO_SENTENCES, 0.0)
    assert first.text == "Sure, I can help you"  # the rest of the sentence waits
    plan.audio_ready(0.85)  # all of the first chunk's audio: estimated done at 0.85
    # "with that right away." from `now` (0.875 s) needs a 0.1 s hold before 1.43 s of audio
    assert [plan.release_at(now) for now in (0.85, 0.9, 1.2)] == pytest.approx([0.95, 1.0, 1.3])
    assert plan.timeline(1.2).free == 1.2
