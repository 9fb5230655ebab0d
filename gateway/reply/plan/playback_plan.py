"""The playback-aware chunk plan, pure: where to cut a reply's streamed text, by when each
chunk's audio is needed, and when the listener's playback should start.

Every chunk has a deadline: the moment the audio before it runs out. The first chunk goes out
at the first natural boundary after a few words (a clause mark, a sentence end, or before a
phrase: "Sure, I can help you | with that right away."; the chunker decides) and is needed at
once. Its audio is short, so playback starts (`release_at`) when the sentences known so far,
synthesized one after another, can each be ready before the audio before them runs out, with a
margin (`margin_s` plus `margin_share` of its own synthesis); at most `first_hold_s` after the
first audio is ready: a short first chunk and a short hold give earlier first audio than a
whole first sentence, and no gap after it. Later text is held as whole sentences and sent as
one chunk as large as can still be synthesized before its deadline, given the measured
synthesis speed and that a reply's chunks are synthesized one after another: chunks grow as the
listener's buffer grows (fewer engine calls, each a little cheaper per character). A sentence
too long for its deadline is cut before a phrase. The next chunk is decided just before the one
before it should be finished (so the engine never waits for the plan, and the decision uses
what the model server has reported so far). While the engine keeps to the estimate, a reply
has one chunk at most waiting behind the one being synthesized; while it falls behind, the
plan goes on deciding by its estimate (which each report corrects), but never has more than
`UNFINISHED_MAX` chunks unfinished at the model server, whose session refuses requests past
its limit (`too_many_pending`): the rest of the text waits in the plan until a chunk is
reported done. (Deciding only on each report instead, with the reply later by then, cuts
smaller chunks when the engine is behind: more calls for the same text.)

A chunk's audio is ready in steps: its first frame (its first window on a progressive
server, its first segment on one whose unit of output is the chunk) `first_s` after its
synthesis starts, and the rest by the end of its synthesis (`synth_s`), window by window on a
progressive server (`timeline.window_spans`: each window twice the one before, as the server's
are).
The plan learns both times and how much audio a first frame holds (`completed`), and asks of
every chunk that its first audio be ready, with a margin, when the audio before it runs out,
and each later window, with a margin on the synthesis up to it, before the audio before it
has played. With an engine whose unit is the chunk and a chunk of one segment the first audio
is all of it and the plan is what it always was; with a progressive engine the first audio of
a chunk is early, and the plan holds the first audio only as long as the rest of the chunks
need to follow it, and cuts chunks as large as their windows can follow in time (under load,
smaller again).

Time is the caller's clock in seconds (`now`); nothing here reads a clock or sleeps. `wake_at()`
says when the plan wants `tick()` called if no text or audio arrives first.

What the plan knows is its record of the chunks sent (`timeline.Sent`: each estimated when it
is sent, corrected by the reports: its first audio, its completion), the text not sent yet, the
learned rates (`rates.Rates`, read at the moment asked) and whether playback has started. From
those and the moment it computes one timeline (`timeline.build`: each chunk's synthesis start,
first audio, windows, finish and audio, the hold, when each chunk is needed, and the text not
sent as it would be cut) and keeps it until one of them changes (`timeline.Timeline.holds`):
every question here reads it, and an audio piece that changes nothing computes nothing. The
moment counts only as when the engine is free for the text not sent: past the estimate of the
chunks sent, with text waiting, each moment moves the timeline, and gets its own.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from gateway.reply.chunker import ChunkerConfig, IncrementalSentenceChunker
from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.protocol import UNFINISHED_MAX, Chunk, Plan, Playback
from gateway.reply.plan.rates import EarlyAudio, Rates, SpeechRate, chunk_speed
from gateway.reply.plan.timeline import Inputs, Sent, Timeline, build, spoken_chars
from kokoro_contract.speed import SpeedModel


@dataclass(eq=False)  # one plan per reply: compared (and found in lists) by identity
class ChunkPlan(Plan, Playback):
    config: PlanConfig = field(default_factory=PlanConfig)
    # seconds of synthesis per chunk against its characters, queueing included: learned here
    # from the model server's synthesis_complete reports (`completed`), shared across replies
    speed: SpeedModel = field(default_factory=chunk_speed)
    speech: SpeechRate = field(default_factory=SpeechRate)  # shared across replies, learned
    speed_factor: float = 1.0  # reply speed: audio is this much shorter
    # seconds from a chunk's synthesis start to its first audio, learned the same way, and
    # read once `early` shows the server speaks progressively; until then (or None) the same
    # as its whole synthesis (an engine whose unit of output is the chunk)
    first_speed: SpeedModel | None = None
    early: EarlyAudio | None = None  # how much audio a chunk's first frame holds (learned)
    # the reply's model server had nothing else to do when it took the reply: its first chunk
    # is needed as soon as it can be ready, with no slack, which would only let a progressive
    # server open the chunk with a larger window (the later the deadline, the larger) and
    # so give the first audio later, with no other reply to spare
    alone: bool = False

    def __post_init__(self) -> None:
        cfg = self.config
        self._chunker = IncrementalSentenceChunker(
            ChunkerConfig(
                first_min_words=cfg.first_min_words,
                first_max_words=cfg.first_max_words,
                first_wait_words=cfg.first_wait_words,
                merge_below_chars=0,  # whole sentences; the plan groups them
                soft_max_chars=min(200, cfg.max_chars),
                max_chars=min(300, cfg.max_chars),
            )
        )
        self._units: list[str] = []  # final sentences not sent yet
        self._sent: list[Sent] = []  # the record of the chunks sent
        self._first_text: float | None = None
        self._first_overdue = False  # its first wait passed with too few words to cut
        self._first_audio: float | None = None
        self._first_ready: float | None = None
        self._ended = False
        self._timeline: Timeline | None = None  # the last one computed (`timeline`)

    @property
    def playback(self) -> Playback:
        """The plan itself: it holds the listener's playback."""
        return self

    # --- inputs -----------------------------------------------------------------------------

    def push(self, text: str, now: float) -> list[Chunk]:
        if self._first_text is None and text.strip():
            self._first_text = now
        self._units += self._chunker.push(text)
        self._cut_slow_first(now)
        return self._release(now)

    def flush(self, now: float) -> list[Chunk]:
        self._units += self._chunker.flush()
        self._ended = True
        return self._release(now)

    def cut(self, now: float) -> list[Chunk]:
        """What the client sent so far is final: its last words become a unit of their own,
        sent when the plan's timing says, as every unit is."""
        self._units += self._chunker.flush()
        return self._release(now)

    def tick(self, now: float) -> list[Chunk]:
        self._cut_slow_first(now)
        return self._release(now)

    def _cut_slow_first(self, now: float) -> None:
        """Past its first wait, the first chunk is cut as soon as it has enough words (slow
        text: do not wait longer for a boundary)."""
        waiting_first = not self._sent and not self._units and self._first_text is not None
        if waiting_first and now >= (self._first_text or 0.0) + self.config.first_wait_s:
            first = self._chunker.cut_first_now()
            if first is not None:
                self._units.append(first)
            else:  # too few words: the next text tries again (no wake-up meanwhile)
                self._first_overdue = True

    def audio_started(self, now: float) -> None:
        """The reply's first audio went to the listener: playback starts."""
        if self._first_audio is None:
            self._first_audio = now

    def release_at(self, now: float) -> float | None:
        """When the first audio, ready, should go to the listener (the timeline's hold). None
        once playback started or before anything was sent."""
        if self._first_audio is not None or not self._sent:
            return None
        return self.timeline(now).play_start

    def audio_ready(self, now: float) -> None:
        """Audio has come back: the first chunk's first audio is ready by now, and the rest of
        it follows at the learned speed. Every later piece changes nothing."""
        if self._sent and self._first_ready is None:
            self._first_ready = now
            first = self._sent[0]
            if not first.done:
                rates = self._rates()
                finish = now + rates.synth_s(first.chars) - rates.first_s(first.chars)
                self._sent[0] = dataclasses.replace(first, first=now, finish=finish)

    def completed(
        self,
        index: int,
        audio_s: float,
        now: float,
        synth_s: float | None = None,
        first_s: float | None = None,
        early_s: float | None = None,
    ) -> None:
        """Chunk `index` finished: how long it plays, how long it took to synthesize and to
        give its first audio, and how much audio its first frame held (the shared speeds
        learn them; None: not reported)."""
        sent = self._sent[index]
        first = min(sent.first, now)
        sent = self._sent[index] = dataclasses.replace(
            sent, done=True, finish=now, audio_s=audio_s, first=first
        )
        self.speech.observe(sent.chars, audio_s, self.speed_factor)
        if synth_s is not None:
            self.speed.observe(sent.chars, synth_s)
        # a first chunk's first audio and first frame only: a later chunk's first window is as
        # large as its lead lets the server make it (seconds, not the fraction of one a reply
        # opens with), so its first audio is as late as its deadline allows; learned from it,
        # the plan would expect every chunk's first audio that late and cut the chunks after
        # the first smaller than they need be, and release a first chunk too soon
        if index == 0 and first_s is not None and self.first_speed is not None:
            self.first_speed.observe(sent.chars, min(first_s, synth_s or first_s))
        if index == 0 and early_s is not None and self.early is not None:
            self.early.observe(early_s, audio_s)
        rates = self._rates()
        before = sent
        for later_index in range(index + 1, len(self._sent)):
            later = self._sent[later_index]  # the ones behind it start when it is done
            if not later.done:
                start = max(before.finish, later.sent_at)
                first = start + rates.first_s(later.chars)
                finish = start + rates.synth_s(later.chars)
                later = dataclasses.replace(later, start=start, first=first, finish=finish)
                self._sent[later_index] = later
            before = later

    @property
    def started(self) -> bool:
        """Whether a chunk has gone to the engine."""
        return bool(self._sent)

    @property
    def unsent(self) -> bool:
        """Whether final text waits to be sent (for its time, or for a chunk to complete)."""
        return bool(self._units)

    @property
    def asking(self) -> bool:
        """Whether the reply asks the engine for synthesis now, or is about to: a chunk
        there unfinished, final text to send, or a first chunk's text within its first wait.
        Text short of a sentence after that, or no text at all, asks nothing yet."""
        first_due = not self._sent and self._first_text is not None and not self._first_overdue
        return first_due or bool(self._units) or self._unfinished() > 0

    def _unfinished(self) -> int:
        return sum(not s.done for s in self._sent)

    # --- questions: each reads the timeline -------------------------------------------------

    def timeline(self, now: float) -> Timeline:
        """The timeline at `now`: the one computed last while it holds (its inputs unchanged,
        and the moment none that moves it), else a new one."""
        inputs = Inputs(
            tuple(self._sent),
            tuple(self._units),
            self._rates(),
            self.config,
            self._first_ready is not None,
            self._first_audio,
        )
        known = self._timeline
        if known is None or not known.holds(inputs, now):
            known = self._timeline = build(inputs, now)
        return known

    def spare_profile(self, now: float) -> tuple[tuple[float, float], ...]:
        """For each chunk still to come, as far as its text known tells, in order: how much
        later it could be ready and still play with no gap, and the seconds of synthesis from
        now until it is done (its own and the chunks' before it, one after another). Before
        its first chunk: one entry, with no spare (its first chunks are about to need the
        engine); before playback, one: how much further its start may slide, and all the
        synthesis left. Empty when nothing is left to synthesize."""
        if self._ended and not self._units and all(s.done for s in self._sent):
            return ()
        return self.timeline(now).spare_profile(now)

    def done_in_s(self, now: float) -> float:
        """How long until the text known so far is all synthesized (estimated)."""
        return self.timeline(now).done_in_s(now)

    def wake_at(self) -> float | None:
        if self._ended and not self._units:
            return None
        if not self._sent:
            if self._first_text is None or self._first_overdue:
                return None  # no text yet, or too little to cut: wait for more
            return self._first_text + self.config.first_wait_s
        if self._units and self._unfinished() < UNFINISHED_MAX:
            return self._busy_until() - self.config.lead_s
        return None  # nothing to send, or nothing until a chunk completes

    # --- decisions --------------------------------------------------------------------------

    def _busy_until(self) -> float:
        """When the chunks sent so far should all be synthesized (the record's last finish)."""
        return self._sent[-1].finish if self._sent else float("-inf")

    def _rates(self) -> Rates:
        return Rates.of(self.speed, self.speech, self.speed_factor, self.first_speed, self.early)

    def _send(self, text: str, now: float) -> Chunk:
        start = max(now, self._busy_until())
        audio_before = sum(s.audio_s for s in self._sent)
        first = not self._sent
        chars = spoken_chars(text)
        rates = self._rates()
        ready, finish = start + rates.first_s(chars), start + rates.synth_s(chars)
        self._sent.append(Sent(chars, now, start, ready, finish, rates.audio_s(chars)))
        if first:
            slack = 0.0 if self.alone else self.config.first_slack_s
            return Chunk(text, (rates.first_s(chars) + slack) * 1000)
        needed = self.timeline(now).play_start + audio_before
        return Chunk(text, max(0.0, (needed - now) * 1000))

    def _release(self, now: float) -> list[Chunk]:
        out: list[Chunk] = []
        if not self._sent:
            if not self._units:
                return out
            out.append(self._send(self._units.pop(0), now))  # the first chunk goes at once
        while self._units:
            if now < self._busy_until() - self.config.lead_s:
                break  # the engine is busy: decide later, with more text and what it reports
            if self._unfinished() >= UNFINISHED_MAX:
                break  # far behind the estimate: decide when it reports a chunk done
            # a sentence too long for its deadline: cut before a phrase (as the timeline has it)
            planned = self.timeline(now).planned[0]
            head, tail = planned.text, planned.rest
            self._units[0:1] = [head] if tail is None else [head, tail]
            timeline = self.timeline(now)
            group = self._units[0]
            taken = 1
            for unit in self._units[1:]:
                candidate = f"{group} {unit}"
                if (
                    spoken_chars(candidate) > self.config.max_chars
                    or timeline.inputs.rates.first_s(spoken_chars(candidate))
                    > self.config.max_group_s
                    or not timeline.fits(spoken_chars(candidate))
                ):
                    break
                group, taken = candidate, taken + 1
            del self._units[:taken]
            out.append(self._send(group, now))
        return out
