"""A playback plan's timeline, pure: one computation of when each chunk's synthesis starts, when
its first audio and each later window are ready, when its synthesis ends and how long it plays,
for the chunks sent (as the plan's record has them) and for the text not sent yet (cut as the
plan would cut it); of when playback should start (the hold); and so of when each chunk's audio
is needed. Every question a playback plan asks reads it.

The engine synthesizes a reply's chunks one after another. A chunk's first audio is ready
`Rates.first_s` after its synthesis starts, the rest by `Rates.synth_s`, window by window on a
progressive server (`window_spans`: each window twice the one before, as the server's are),
the synthesis after the first audio spread over the audio after the first window. A chunk
keeps up when its first audio is ready a margin (`margin_s` plus `margin_share` of its first
audio's synthesis) before the audio before it runs out, and each later window a margin on the
synthesis up to it (`ready_margin_s` instead of `margin_s` for a first chunk whose first audio
is here) before the audio before that window has played (`spare`).

A timeline is a function of its `Inputs` and of the moment only through when the engine is free
for the text not sent, `max(now, busy_until)`: while the engine is busy with the chunks sent,
or no text waits, the same timeline answers at every moment (`Timeline.holds`). So a plan
computes it again when an input changes (or, past the estimate with text waiting, when the
moment does), never because an audio piece came."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from gateway.reply.chunker import (
    CJK_CLAUSE_MARKS,
    CLAUSE_MARKS,
    PHRASE_STARTS,
    WORD_CHARS,
    spoken_len,
    word_of,
)
from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.rates import Rates

HOLD_STEP_S = 0.05  # how finely the start of playback is chosen
TIE_S = 1e-9  # a spare this small is none: sums of seconds in floating point land beside 0


def window_spans(audio_s: float, first_s: float, largest_s: float) -> list[tuple[float, float]]:
    """Where a progressive model server's windows of a chunk of `audio_s` seconds begin and
    end, in seconds of its audio, as the plan expects them: the first holds `first_s`, each
    after it twice the one before up to `largest_s`, and what is left after a window, when
    shorter than the first, goes into it (as the server's window ladder does,
    `model_server.windows`). One span when the first holds it all (an engine whose unit of
    output is the chunk)."""
    spans: list[tuple[float, float]] = []
    begin, size = 0.0, max(first_s, 1e-3)
    while begin < audio_s:
        end = begin + size
        if audio_s - end < first_s:
            end = audio_s
        spans.append((begin, end))
        begin, size = end, max(size, min(largest_s, 2 * size))
    return spans or [(0.0, audio_s)]


@dataclass(frozen=True)
class Sent:
    """A chunk sent, as the plan's record has it: estimated when it was sent, corrected by what
    the model server reports (the first audio, the chunk's completion)."""

    chars: int
    sent_at: float
    start: float  # when its synthesis starts (estimated)
    first: float  # when its first audio should be ready (estimated; corrected when it is)
    finish: float  # when its synthesis should end (estimated; corrected when it completes)
    audio_s: float  # how long it plays (estimated; corrected when it completes)
    done: bool = False


@dataclass(frozen=True)
class Window:
    """A window after a chunk's first: where it begins in the chunk's audio (it is needed that
    long after the chunk's audio is), and how much of the chunk's synthesis after its first
    audio it waits for."""

    begin: float
    done: float


@dataclass(frozen=True)
class Slot:
    """One chunk on the timeline."""

    chars: int
    start: float  # its synthesis starts
    first: float  # its first audio is ready
    finish: float  # its synthesis ends
    audio_s: float  # how long it plays
    first_s: float  # its synthesis to its first audio, as the rates say now (its margin's share)
    windows: tuple[Window, ...]  # after the first; none when the first frame holds all of it
    done: bool = False  # reported complete

    @classmethod
    def of(
        cls,
        chars: int,
        start: float,
        first: float,
        finish: float,
        audio_s: float,
        rates: Rates,
        config: PlanConfig,
        done: bool = False,
    ) -> Slot:
        """A chunk whose first audio is ready at `first` and the rest by `finish`."""
        spans = window_spans(audio_s, rates.early(audio_s), config.largest_window_s)
        windows: tuple[Window, ...] = ()
        if len(spans) > 1:
            opened = spans[0][1]
            rest = max(0.0, finish - first)
            windows = tuple(
                Window(begin, rest * (end - opened) / (audio_s - opened))
                for begin, end in spans[1:]
            )
        return cls(chars, start, first, finish, audio_s, rates.first_s(chars), windows, done)

    @classmethod
    def at(cls, chars: int, start: float, rates: Rates, config: PlanConfig) -> Slot:
        """A chunk of `chars` not sent yet, its synthesis from `start`."""
        first, finish = start + rates.first_s(chars), start + rates.synth_s(chars)
        return cls.of(chars, start, first, finish, rates.audio_s(chars), rates, config)

    @property
    def ready(self) -> tuple[float, ...]:
        """When its first audio, then each later window, is ready."""
        return (self.first, *(self.first + window.done for window in self.windows))


def rest_spare(slot: Slot, at: float, config: PlanConfig, fixed: float | None = None) -> float:
    """How much later the rest of `slot`, after its first audio, could be synthesized and still
    play from `at` with no gap: each later window ready before the audio before it has played,
    with a margin: `fixed` (`margin_s` when None; at most the synthesis before it) and
    `margin_share` of it. Unbounded when the first audio is all of it."""
    fixed = config.margin_s if fixed is None else fixed
    spare = math.inf
    for window in slot.windows:
        margin = min(fixed, window.done) + config.margin_share * window.done
        spare = min(spare, at + window.begin - slot.first - window.done - margin)
    return spare


def spare(slot: Slot, at: float, config: PlanConfig) -> float:
    """How much later `slot` could be ready and still play from `at` with no gap: its first
    audio before it is needed, with its margin, and each later window in time (`rest_spare`)."""
    first_margin = config.margin_s + config.margin_share * slot.first_s
    return min(at - slot.first - first_margin, rest_spare(slot, at, config))


def cut(
    unit: str, start: float, needed: float, rates: Rates, config: PlanConfig
) -> tuple[str, str | None]:
    """`unit` whole if its synthesis, from `start`, ends its margin before `needed`; else
    cut before a phrase (a clause mark, a conjunction or preposition; in Japanese or Chinese,
    after a clause mark `、，；：`) that leaves `first_min_words` words on each side (of CJK
    text, as much speech: `spoken_len`): the longest first part that is ready in time, else
    the shortest (late, but less late than the whole); whole if there is no such place."""
    min_words = config.first_min_words

    def fits(text: str) -> bool:
        return spare(Slot.at(spoken_chars(text), start, rates, config), needed, config) >= 0

    if fits(unit):
        return unit, None
    words = unit.split(" ")
    cuts = [
        (" ".join(words[:i]), " ".join(words[i:]))
        for i in range(min_words, len(words) - min_words + 1)
        if words[i - 1][-1] in CLAUSE_MARKS or word_of(words[i]) in PHRASE_STARTS
    ]
    least = min_words * WORD_CHARS
    cuts += [
        (unit[: i + 1].strip(), unit[i + 1 :].strip())
        for i, c in enumerate(unit)
        if c in CJK_CLAUSE_MARKS
        and spoken_len(unit[: i + 1]) >= least
        and spoken_len(unit[i + 1 :]) >= least
    ]
    if not cuts:
        return unit, None
    cuts.sort(key=lambda parts: len(parts[0]))
    fitting = [parts for parts in cuts if fits(parts[0])]
    head, tail = fitting[-1] if fitting else cuts[0]
    return head, tail


def spoken_chars(text: str) -> int:
    """A chunk's length as the plan counts it: in English characters' worth of speech (a CJK
    character 2.5: `chunker.spoken_len`), so one learned rate serves every script."""
    return round(spoken_len(text))


@dataclass(frozen=True)
class Inputs:
    """What a timeline is computed from, besides the moment: equal inputs, equal timelines
    (while `Timeline.holds`)."""

    sent: tuple[Sent, ...]  # the plan's record of the chunks sent
    waiting: tuple[str, ...]  # final text not sent yet, a sentence each (or a sentence's rest)
    rates: Rates
    config: PlanConfig
    first_ready: bool  # the first chunk's first audio has come
    played_from: float | None  # when playback started (None: not yet)


@dataclass(frozen=True)
class Planned:
    """Text not sent yet as the plan would cut it, synthesized after what is before it."""

    text: str
    rest: str | None  # what of its sentence it leaves to the next (None: it is whole)
    slot: Slot
    needed: float  # when its audio is needed: the audio before it has played


@dataclass(frozen=True)
class Timeline:
    """A reply's chunks in time, from its `Inputs` at one moment (`build`); the questions
    asked at a moment of their own (`done_in_s`, `spare_profile`) read it from there."""

    inputs: Inputs
    sent: tuple[Slot, ...]  # the chunks sent, as the record has them
    busy_until: float  # when the chunks sent should all be synthesized (-inf: none)
    # when the engine is free for the text not sent: max(now, busy_until) (busy_until when no
    # text waits: then nothing on the timeline depends on the moment)
    free: float
    # when playback starts: when it did, else the end of the hold (inf: nothing sent yet)
    play_start: float
    plays_at: tuple[float, ...]  # when each chunk sent is needed, playing from `play_start`
    runs_out: float  # when the audio sent runs out: the next chunk's deadline
    planned: tuple[Planned, ...]  # the text not sent, cut, after the chunks sent (once one is)
    waiting_synth_s: float  # the text not sent, synthesized a sentence at a time

    def holds(self, inputs: Inputs, now: float) -> bool:
        """Whether this is the timeline of `inputs` at `now` too."""
        if inputs != self.inputs:
            return False
        return not inputs.waiting or max(now, self.busy_until) == self.free

    def fits(self, chars: int) -> bool:
        """Whether a chunk of `chars` sent next, its synthesis when the engine is free, is
        ready with its margins before the audio sent runs out."""
        slot = Slot.at(chars, self.free, self.inputs.rates, self.inputs.config)
        return spare(slot, self.runs_out, self.inputs.config) >= 0

    def done_in_s(self, now: float) -> float:
        """How long from `now` until the text known so far is all synthesized."""
        ready = max(now, self.busy_until)
        ready += self.waiting_synth_s
        if not self.sent and self.inputs.waiting:
            ready += self.inputs.rates.synth_s(0)  # not started: its first chunk is one call more
        return ready - now

    def spare_profile(self, now: float) -> tuple[tuple[float, float], ...]:
        """For each chunk still to come, in order (those sent and not done, then the text not
        sent, a sentence each, none of it ready before `now`): how much later it could be
        ready and still play with no gap, and the seconds of synthesis from `now` until it is
        done. Before the first chunk: one entry, with no spare; before playback, one: how much
        further its start may slide, and all the synthesis left."""
        rates, config, played = self.inputs.rates, self.inputs.config, self.inputs.played_from
        if not self.sent:
            return ((0.0, self.done_in_s(now)),)
        if played is None:
            slide = self.sent[0].first + config.first_hold_s - self.play_start
            return ((slide, self.done_in_s(now)),)
        profile: list[tuple[float, float]] = []
        before, ready = 0.0, now
        for sent in self.sent:
            if not sent.done:
                first = max(ready, sent.first)
                ready = max(ready, sent.finish)
                late = Slot.of(sent.chars, sent.start, first, ready, sent.audio_s, rates, config)
                profile.append((spare(late, played + before, config), ready - now))
            before += sent.audio_s
        for unit in self.inputs.waiting:
            slot = Slot.at(spoken_chars(unit), ready, rates, config)
            ready = slot.finish
            profile.append((spare(slot, played + before, config), ready - now))
            before += slot.audio_s
        return tuple(profile)


def build(inputs: Inputs, now: float) -> Timeline:
    """The timeline of `inputs` at `now`."""
    rates, config, waiting = inputs.rates, inputs.config, inputs.waiting
    sent = tuple(
        Slot.of(s.chars, s.start, s.first, s.finish, s.audio_s, rates, config, s.done)
        for s in inputs.sent
    )
    busy_until = sent[-1].finish if sent else -math.inf
    free = max(now, busy_until) if waiting else busy_until
    if not sent:
        play_start = math.inf
    elif inputs.played_from is not None:
        play_start = inputs.played_from
    else:
        play_start = _hold_end(sent, waiting, free, inputs.first_ready, rates, config)
    plays_at: list[float] = []
    before = 0.0
    for slot in sent:
        plays_at.append(play_start + before)
        before += slot.audio_s
    audio_sent = sum(s.audio_s for s in sent)
    planned = tuple(_planned(waiting, free, play_start, audio_sent, rates, config)) if sent else ()
    return Timeline(
        inputs,
        sent,
        busy_until,
        free,
        play_start,
        tuple(plays_at),
        play_start + audio_sent,
        planned,
        sum(rates.synth_s(spoken_chars(unit)) for unit in waiting),
    )


def _planned(
    waiting: tuple[str, ...],
    free: float,
    start: float,
    before: float,
    rates: Rates,
    config: PlanConfig,
) -> Iterator[Planned]:
    """The text not sent, with playback from `start` and `before` seconds of audio ahead of
    it: each sentence whole, or cut before a phrase where whole would be late (`cut`), one
    after another from `free`."""
    ready = free
    units = list(waiting)
    while units:
        head, rest = cut(units.pop(0), ready, start + before, rates, config)
        slot = Slot.at(spoken_chars(head), ready, rates, config)
        yield Planned(head, rest, slot, start + before)
        ready = slot.finish
        before += slot.audio_s
        if rest:
            units.insert(0, rest)


def _hold_end(
    sent: tuple[Slot, ...],
    waiting: tuple[str, ...],
    free: float,
    first_ready: bool,
    rates: Rates,
    config: PlanConfig,
) -> float:
    """When playback should start: the earliest moment, from when the first chunk's first
    audio is ready to `first_hold_s` later, from which the chunks sent and then the text not
    sent (`_planned`) can each be ready, with its margins, before the audio before them runs
    out."""
    first = sent[0].first
    latest = first + config.first_hold_s
    step = 0
    while (start := first + step * HOLD_STEP_S) < latest and not _keeps_up(
        start, sent, waiting, free, first_ready, rates, config
    ):
        step += 1  # counted, not summed: the steps land where they are written
    return min(start, latest)


def _keeps_up(
    start: float,
    sent: tuple[Slot, ...],
    waiting: tuple[str, ...],
    free: float,
    first_ready: bool,
    rates: Rates,
    config: PlanConfig,
) -> bool:
    """Whether playback from `start` has no gap, as far as the text known tells."""
    head = sent[0]
    fixed = config.ready_margin_s if first_ready else None
    if rest_spare(head, start, config, fixed) < -TIE_S:
        return False  # the first chunk itself would run out before it is synthesized
    before = head.audio_s
    for slot in sent[1:]:
        if not slot.done and spare(slot, start + before, config) < -TIE_S:
            return False
        before += slot.audio_s
    planned = _planned(waiting, free, start, before, rates, config)
    return not any(spare(p.slot, p.needed, config) < -TIE_S for p in planned)
