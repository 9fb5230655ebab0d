"""The playback-aware chunk plan, pure: where to cut a reply's streamed text and by when each
chunk's audio is needed.

The listener plays from the first audio on; from then on every chunk has a deadline, the moment
the audio before it runs out. The first chunk goes out early at a natural boundary (a clause
mark, a sentence end, or before a phrase: the chunker decides) and is needed at once. Later text
is held as whole sentences and sent as one chunk as large as can still be synthesized before its
deadline, given the measured synthesis speed and that a reply's chunks are synthesized one after
another: chunks grow as the listener's buffer grows (fewer engine calls, each a little cheaper
per character). A sentence too long for its deadline is cut before a phrase. The next chunk is
decided just before the one before it should be finished (so the engine never waits for the
plan, and the decision uses what the model server has reported so far); a reply never has more
than one chunk waiting behind the one being synthesized.

Time is the caller's clock in seconds (`now`); nothing here reads a clock or sleeps. `wake_at()`
says when the plan wants `tick()` called if no text or audio arrives first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.chunker import (
    CLAUSE_MARKS,
    PHRASE_STARTS,
    ChunkerConfig,
    IncrementalSentenceChunker,
    word_of,
)
from kokoro_contract.speed import SpeedModel


@dataclass(frozen=True)
class PlanConfig:
    first_min_words: int = 4
    first_max_words: int = 8  # past this, the first chunk is cut only where a phrase begins...
    first_wait_words: int = 16  # ...or here at the latest
    first_wait_s: float = 0.6  # ...or this long after the first text, if the text is slow
    max_chars: int = 400  # one chunk: under Kokoro's 510 phonemes
    margin_s: float = 0.5  # a chunk should be ready this long before the listener needs it
    lead_s: float = 0.15  # send the next chunk this long before the one before it is done
    # the first chunk is needed when it could be ready plus this: under load, a new reply's
    # first chunk waits this long rather than make a reply in progress late
    first_slack_s: float = 1.0


@dataclass
class SpeechRate:
    """Characters spoken per second at speed 1, learned from the audio each chunk gave."""

    chars_per_s: float = 18.0  # Kokoro at speed 1, measured: 17-20
    weight: float = 0.2  # how far one chunk moves the estimate

    def observe(self, chars: int, audio_s: float, speed: float) -> None:
        if chars >= 10 and audio_s > 0:
            seen = chars / (audio_s * speed)
            self.chars_per_s += self.weight * (seen - self.chars_per_s)


@dataclass(frozen=True)
class Chunk:
    text: str
    deadline_ms: float  # from now: when its first audio is needed


@dataclass
class _Sent:
    chars: int
    sent_at: float
    finish: float  # when its synthesis should end (estimated; corrected when it completes)
    audio_s: float  # how long it plays (estimated; corrected when it completes)
    done: bool = False


@dataclass
class ChunkPlan:
    config: PlanConfig = field(default_factory=PlanConfig)
    # seconds of synthesis per chunk against its characters, queueing included: learned by
    # the caller from the model server's synthesis_complete events, shared across replies
    speed: SpeedModel = field(default_factory=lambda: SpeedModel(0.1, 0.032))
    speech: SpeechRate = field(default_factory=SpeechRate)  # shared across replies, learned
    speed_factor: float = 1.0  # reply speed: audio is this much shorter

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
        self._first_audio: float | None = None
        self._ended = False

    # --- inputs -----------------------------------------------------------------------------

    def push(self, text: str, now: float) -> list[Chunk]:
        if self._first_text is None and text.strip():
            self._first_text = now
        self._units += self._chunker.push(text)
        return self._release(now)

    def flush(self, now: float) -> list[Chunk]:
        self._units += self._chunker.flush()
        self._ended = True
        return self._release(now)

    def tick(self, now: float) -> list[Chunk]:
        waiting_first = not self._sent and not self._units and self._first_text is not None
        if waiting_first and now >= (self._first_text or 0.0) + self.config.first_wait_s:
            first = self._chunker.cut_first_now()  # slow text: do not wait longer
            if first is not None:
                self._units.append(first)
        return self._release(now)

    def audio_started(self, now: float) -> None:
        """The reply's first audio reached the listener's side."""
        if self._first_audio is None:
            self._first_audio = now

    def completed(self, index: int, audio_s: float, now: float) -> None:
        """Chunk `index` finished: how long it plays."""
        sent = self._sent[index]
        sent.done, sent.finish, sent.audio_s = True, now, audio_s
        self.speech.observe(sent.chars, audio_s, self.speed_factor)
        before = sent
        for later in self._sent[index + 1 :]:  # the ones behind it start when it is done
            if not later.done:
                later.finish = max(before.finish, later.sent_at) + self._synth_s(later.chars)
            before = later

    def wake_at(self) -> float | None:
        if self._ended and not self._units:
            return None
        if not self._sent:
            if self._first_text is None:
                return None
            return self._first_text + self.config.first_wait_s
        if self._units:
            return self._busy_until() - self.config.lead_s
        return None

    # --- decisions --------------------------------------------------------------------------

    def _busy_until(self) -> float:
        """When the chunks sent so far should all be synthesized."""
        return self._sent[-1].finish if self._sent else float("-inf")

    def _play_start(self) -> float:
        if self._first_audio is not None:
            return self._first_audio
        return self._sent[0].finish if self._sent else float("inf")

    def _synth_s(self, chars: int) -> float:
        return self.speed.estimate(chars)

    def _audio_s(self, chars: int) -> float:
        return chars / (self.speech.chars_per_s * self.speed_factor)

    def _send(self, text: str, now: float) -> Chunk:
        start = max(now, self._busy_until())
        audio_before = sum(s.audio_s for s in self._sent)
        first = not self._sent
        chars = len(text)
        self._sent.append(_Sent(chars, now, start + self._synth_s(chars), self._audio_s(chars)))
        if first:
            return Chunk(text, (self._synth_s(chars) + self.config.first_slack_s) * 1000)
        needed = self._play_start() + audio_before
        return Chunk(text, max(0.0, (needed - now) * 1000))

    def _fits(self, chars: int, now: float) -> bool:
        start = max(now, self._busy_until())
        needed = self._play_start() + sum(s.audio_s for s in self._sent)
        return start + self._synth_s(chars) + self.config.margin_s <= needed

    def _split_first_unit(self, now: float) -> None:
        """Cut the next sentence before a phrase (a clause mark, a conjunction or
        preposition) so that its first part can still be ready in time; left whole if no such
        place leaves `first_min_words` words on each side."""
        unit = self._units[0]
        words = unit.split(" ")
        best = None
        for i in range(self.config.first_min_words, len(words) - self.config.first_min_words + 1):
            head = " ".join(words[:i])
            if not self._fits(len(head), now):
                break
            if head[-1] in CLAUSE_MARKS or word_of(words[i]) in PHRASE_STARTS:
                best = i
        if best is not None:
            self._units[0:1] = [" ".join(words[:best]), " ".join(words[best:])]

    def _release(self, now: float) -> list[Chunk]:
        out: list[Chunk] = []
        if not self._sent:
            if not self._units:
                return out
            out.append(self._send(self._units.pop(0), now))  # the first chunk goes at once
        while self._units:
            if now < self._busy_until() - self.config.lead_s:
                break  # the engine is busy: decide later, with more text and what it reports
            if not self._fits(len(self._units[0]), now):
                self._split_first_unit(now)  # a sentence too long for its deadline: a phrase
            group = self._units[0]
            taken = 1
            for unit in self._units[1:]:
                candidate = f"{group} {unit}"
                if len(candidate) > self.config.max_chars or not self._fits(len(candidate), now):
                    break
                group, taken = candidate, taken + 1
            del self._units[:taken]
            out.append(self._send(group, now))
        return out
