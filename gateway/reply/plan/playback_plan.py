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
progressive server (`window_spans`: each window twice the one before, as the server's are).
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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.reply.chunker import (
    CLAUSE_MARKS,
    PHRASE_STARTS,
    ChunkerConfig,
    IncrementalSentenceChunker,
    word_of,
)
from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.protocol import UNFINISHED_MAX, Chunk, Plan, Playback
from gateway.reply.plan.rates import EarlyAudio, SpeechRate, chunk_speed
from kokoro_contract.speed import SpeedModel

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


@dataclass
class _Sent:
    chars: int
    sent_at: float
    first: float  # when its first audio should be ready (estimated; corrected when it is)
    finish: float  # when its synthesis should end (estimated; corrected when it completes)
    audio_s: float  # how long it plays (estimated; corrected when it completes)
    done: bool = False


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
        self._sent: list[_Sent] = []
        self._first_text: float | None = None
        self._first_overdue = False  # its first wait passed with too few words to cut
        self._first_audio: float | None = None
        self._first_ready: float | None = None
        self._ended = False

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
        """When the first audio, ready, should go to the listener (`_planned_start`). None
        once playback started or before anything was sent."""
        if self._first_audio is not None or not self._sent:
            return None
        return self._planned_start(now)

    def audio_ready(self, now: float) -> None:
        """Audio has come back: the first chunk's first audio is ready by now, and the rest of
        it follows at the learned speed."""
        if self._sent and self._first_ready is None:
            self._first_ready = now
            first = self._sent[0]
            if not first.done:
                first.first = now
                first.finish = now + self._synth_s(first.chars) - self._first_s(first.chars)

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
        sent.done, sent.finish, sent.audio_s = True, now, audio_s
        sent.first = min(sent.first, now)
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
        before = sent
        for later in self._sent[index + 1 :]:  # the ones behind it start when it is done
            if not later.done:
                start = max(before.finish, later.sent_at)
                later.first = start + self._first_s(later.chars)
                later.finish = start + self._synth_s(later.chars)
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

    def spare_profile(self, now: float) -> tuple[tuple[float, float], ...]:
        """For each chunk still to come, as far as its text known tells, in order: how much
        later it could be ready and still play with no gap, and the seconds of synthesis from
        now until it is done (its own and the chunks' before it, one after another). Before
        its first chunk: one entry, with no spare (its first chunks are about to need the
        engine); before playback, one: how much further its start may slide, and all the
        synthesis left. Empty when nothing is left to synthesize."""
        if self._ended and not self._units and all(s.done for s in self._sent):
            return ()
        if not self._sent:
            return ((0.0, self.done_in_s(now)),)
        if self._first_audio is None:
            slide = self._sent[0].first + self.config.first_hold_s - self._planned_start(now)
            return ((slide, self.done_in_s(now)),)
        profile: list[tuple[float, float]] = []
        before, ready = 0.0, now
        for sent in self._sent:
            if not sent.done:
                first = max(ready, sent.first)
                ready = max(ready, sent.finish)
                at = self._first_audio + before
                spare = self._spare(sent.chars, first, ready, at, sent.audio_s)
                profile.append((spare, ready - now))
            before += sent.audio_s
        for unit in self._units:
            first = ready + self._first_s(len(unit))
            ready += self._synth_s(len(unit))
            audio = self._audio_s(len(unit))
            spare = self._spare(len(unit), first, ready, self._first_audio + before, audio)
            profile.append((spare, ready - now))
            before += audio
        return tuple(profile)

    def done_in_s(self, now: float) -> float:
        """How long until the text known so far is all synthesized (estimated)."""
        ready = max(now, self._busy_until())
        ready += sum(self._synth_s(len(unit)) for unit in self._units)
        if not self._sent and self._units:
            ready += self._synth_s(0)  # not started: its first chunk is one call more
        return ready - now

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
        """When the chunks sent so far should all be synthesized."""
        return self._sent[-1].finish if self._sent else float("-inf")

    def _planned_start(self, now: float) -> float:
        """When playback should start: the earliest moment, from when the first chunk's first
        audio is ready to `first_hold_s` later, from which the chunks sent and then the sentences
        known (each sent whole, or cut before a phrase where whole would be late) can each be
        ready, with its margins (`_spare`), before the audio before them runs out."""
        first = self._sent[0].first
        latest = first + self.config.first_hold_s
        step = 0
        while (start := first + step * HOLD_STEP_S) < latest and not self._keeps_up(start, now):
            step += 1  # counted, not summed: the steps land where they are written
        return min(start, latest)

    def _keeps_up(self, start: float, now: float) -> bool:
        """Whether playback from `start` has no gap, as far as the text known tells."""
        first = self._sent[0]
        fixed = self.config.ready_margin_s if self._first_ready is not None else None
        if self._rest_spare(first.first, first.finish, start, first.audio_s, fixed) < -TIE_S:
            return False  # the first chunk itself would run out before it is synthesized
        before = first.audio_s
        for sent in self._sent[1:]:
            at = start + before
            if (
                not sent.done
                and self._spare(sent.chars, sent.first, sent.finish, at, sent.audio_s) < -TIE_S
            ):
                return False
            before += sent.audio_s
        ready = max(now, self._busy_until())
        units = list(self._units)
        while units:
            head, tail = self._cut(units.pop(0), ready, start + before)
            audio = self._audio_s(len(head))
            first_at = ready + self._first_s(len(head))
            ready += self._synth_s(len(head))
            if self._spare(len(head), first_at, ready, start + before, audio) < -TIE_S:
                return False
            before += audio
            if tail:
                units.insert(0, tail)
        return True

    def _cut(self, unit: str, start: float, needed: float) -> tuple[str, str | None]:
        """`unit` whole if its synthesis, from `start`, ends its margin before `needed`; else
        cut before a phrase (a clause mark, a conjunction or preposition) that leaves
        `first_min_words` words on each side: the longest first part that is ready in time,
        else the shortest (late, but less late than the whole); whole if there is no such
        place."""
        min_words = self.config.first_min_words

        def fits(text: str) -> bool:
            chars = len(text)
            first, finish = start + self._first_s(chars), start + self._synth_s(chars)
            return self._spare(chars, first, finish, needed, self._audio_s(chars)) >= 0

        if fits(unit):
            return unit, None
        words = unit.split(" ")
        cuts = [
            i
            for i in range(min_words, len(words) - min_words + 1)
            if words[i - 1][-1] in CLAUSE_MARKS or word_of(words[i]) in PHRASE_STARTS
        ]
        if not cuts:
            return unit, None
        fitting = [i for i in cuts if fits(" ".join(words[:i]))]
        best = max(fitting) if fitting else min(cuts)
        return " ".join(words[:best]), " ".join(words[best:])

    def _play_start(self, now: float) -> float:
        if self._first_audio is not None:
            return self._first_audio
        return self._planned_start(now) if self._sent else float("inf")

    def _synth_s(self, chars: int) -> float:
        return self.speed.estimate(chars)

    def _first_s(self, chars: int) -> float:
        """Seconds from a chunk's synthesis start to its first audio (at most the whole): the
        whole until the model server has shown it speaks progressively (`early`), whose first
        audio hardly grows with the chunk (`first_speed`'s prior is that shape)."""
        whole = self._synth_s(chars)
        if self.first_speed is None or self.early is None or self.early.seconds is None:
            return whole
        return min(whole, self.first_speed.estimate(chars))

    def _early(self, audio_s: float) -> float:
        return audio_s if self.early is None else self.early.of(audio_s)

    def _spare(self, chars: int, first: float, finish: float, at: float, audio_s: float) -> float:
        """How much later a chunk of `chars` could be ready and still play from `at` with no
        gap: its first audio (ready at `first`) before it is needed, with its margin, and
        each of its later windows before the audio before it has played (`_rest_spare`)."""
        first_margin = self.config.margin_s + self.config.margin_share * self._first_s(chars)
        return min(at - first - first_margin, self._rest_spare(first, finish, at, audio_s))

    def _rest_spare(
        self, first: float, finish: float, at: float, audio_s: float, fixed: float | None = None
    ) -> float:
        """How much later the rest of a chunk, after its first audio (ready at `first`), could
        be synthesized (by `finish`) and still play from `at` with no gap: each window after
        the first (`window_spans`) ready before the audio before it has played, the synthesis
        from `first` to `finish` spread over the audio after the first window, each with a
        margin: `fixed` (`margin_s` when None; at most the synthesis before it) and
        `margin_share` of it. Unbounded when the first audio is all of it."""
        cfg = self.config
        fixed = cfg.margin_s if fixed is None else fixed
        spans = window_spans(audio_s, self._early(audio_s), cfg.largest_window_s)
        if len(spans) == 1:
            return float("inf")
        opened = spans[0][1]
        rest = max(0.0, finish - first)
        spare = float("inf")
        for begin, end in spans[1:]:
            done = rest * (end - opened) / (audio_s - opened)
            margin = min(fixed, done) + cfg.margin_share * done
            spare = min(spare, at + begin - first - done - margin)
        return spare

    def _audio_s(self, chars: int) -> float:
        return chars / (self.speech.chars_per_s * self.speed_factor)

    def _send(self, text: str, now: float) -> Chunk:
        start = max(now, self._busy_until())
        audio_before = sum(s.audio_s for s in self._sent)
        first = not self._sent
        chars = len(text)
        ready, finish = start + self._first_s(chars), start + self._synth_s(chars)
        self._sent.append(_Sent(chars, now, ready, finish, self._audio_s(chars)))
        if first:
            slack = 0.0 if self.alone else self.config.first_slack_s
            return Chunk(text, (self._first_s(chars) + slack) * 1000)
        needed = self._play_start(now) + audio_before
        return Chunk(text, max(0.0, (needed - now) * 1000))

    def _fits(self, chars: int, now: float) -> bool:
        start = max(now, self._busy_until())
        first, finish = start + self._first_s(chars), start + self._synth_s(chars)
        return self._spare(chars, first, finish, self._needed(now), self._audio_s(chars)) >= 0

    def _needed(self, now: float) -> float:
        """When the audio sent so far runs out: the next chunk's deadline."""
        return self._play_start(now) + sum(s.audio_s for s in self._sent)

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
            # a sentence too long for its deadline: cut before a phrase
            head, tail = self._cut(self._units[0], max(now, self._busy_until()), self._needed(now))
            self._units[0:1] = [head] if tail is None else [head, tail]
            group = self._units[0]
            taken = 1
            for unit in self._units[1:]:
                candidate = f"{group} {unit}"
                if (
                    len(candidate) > self.config.max_chars
                    or self._first_s(len(candidate)) > self.config.max_group_s
                    or not self._fits(len(candidate), now)
                ):
                    break
                group, taken = candidate, taken + 1
            del self._units[:taken]
            out.append(self._send(group, now))
        return out
