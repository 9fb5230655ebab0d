"""Text to PCM for one request: its markup and lexicon read (`text/marked.py`: parts at a rate,
the silence asked between them), normalise + G2P, split into segments, run each segment through
the shared scheduler, trim, convert; a pause is silence between segments. Yields audio segment
by segment (with `timestamps`, each segment's word timings beside it: `timings.py`).

Each segment is needed by a deadline: the request's own (its arrival plus `deadline_ms`, or
its arrival when it names none) for the first, and for each later one that plus the audio
before it, since the listener plays that first.

Progressive (an engine with `front` and `decode`, and `progressive` on): a segment is its front
pass, then windows of its frames (`windows.plan_windows`, from the decoder's learned speed),
each its own step in the scheduler with its own deadline (the segment's plus the audio sent
before the window), joined with crossfades (`windows.Joiner`), trimmed as it comes
(`audio.StreamTrim`, the same samples as trimming the whole), each window's audio yielded as
soon as it is decoded, with the words it settles before it."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Hashable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import numpy.typing as npt

from kokoro_contract import languages, lexicon, limits, markup
from kokoro_contract.audio import SAMPLE_RATE, pcm_duration_s
from kokoro_contract.languages import Language
from kokoro_contract.protocol import SynthesisRequest, WordTiming
from model_server.audio import StreamTrim, TrimPolicy, to_pcm16
from model_server.engines.base import CancelToken, Engine, ProgressiveEngine, Timed
from model_server.engines.weights import load_vocab
from model_server.errors import UnreadableText
from model_server.scheduler import Scheduler, Tally
from model_server.text import marked
from model_server.text.g2p import G2P, LanguageG2P, choose_language
from model_server.text.split import split_phonemes
from model_server.text.words import WordMap
from model_server.timings import WordClock
from model_server.windows import EXACT_FIRST, Joiner, Schedule, Speed, plan_windows

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SegmentPlan:
    """What the engine is asked to voice for a request: its segments, in order; with
    `timestamps`, which phonemes voice which word."""

    segments: tuple[str, ...]
    words: WordMap | None = None
    # with markup: each segment's rate (times the request's speed; none: all 1), and the
    # samples of silence before each segment and after the last (none: no silence)
    rates: tuple[float, ...] = ()
    silences: tuple[int, ...] = ()

    def speed(self, index: int, speed: float) -> float:
        """Segment `index`'s speed for a request at `speed`, within what the model takes."""
        if not self.rates:
            return speed
        return min(max(speed * self.rates[index], limits.MIN_SPEED), limits.MAX_SPEED)

    def silence(self, index: int) -> int:
        """The samples of silence before segment `index` (after the last: `len(segments)`)."""
        return self.silences[index] if self.silences else 0


@dataclass(frozen=True)
class Reading:
    """How a request's text is read: in which language, by which G2P."""

    language: Language
    g2p: G2P


@dataclass(frozen=True)
class SegmentAudio:
    """One segment's audio (PCM s16le) and, with `timestamps`, the words that end in it."""

    pcm: bytes
    words: tuple[WordTiming, ...] | None = None


class Synthesizer:
    def __init__(
        self,
        engine: Engine,
        g2p: G2P,
        scheduler: Scheduler,
        trim: TrimPolicy | None = None,
        progressive: bool = True,
        schedule: Schedule | None = None,
        max_pause_s: float = markup.DEFAULT_MAX_PAUSE_S,
    ) -> None:
        self.engine = engine
        self.g2p = g2p
        self.max_pause_s = max_pause_s
        self.symbols = frozenset(load_vocab())  # what IPA in markup may use
        self.scheduler = scheduler
        self.trim = trim or TrimPolicy()
        # progressive when asked and the engine can
        self.progressive: ProgressiveEngine | None = (
            cast(ProgressiveEngine, engine) if progressive and engine.two_passes else None
        )
        self.schedule = schedule or Schedule()
        scheduler.batch_curve = engine.batch_curve
        if self.progressive is not None and self.progressive.exact_windows:
            # nothing to hide at a seam, nothing to decode twice: no context, no crossfade, and
            # by default `EXACT_FIRST` frames first
            exact = replace(self.schedule, context=0, body_context=0, crossfade=0)
            small = replace(exact, first=EXACT_FIRST, smallest=EXACT_FIRST, remainder=exact.first)
            self.schedule = exact if schedule else small
        scheduler.progressive = self.progressive is not None  # its /load says so
        # G2P is quick but espeak-ng is single-threaded: one thread, off the event loop.
        self._g2p_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="g2p")
        self._spoken_by_others: set[str] = set()  # languages a voice not theirs was asked for

    async def plan(self, request: SynthesisRequest) -> SegmentPlan:
        """The request's text as the engine's segments: its markup read, normalised,
        phonemized and split (packed when the request names a deadline); with `timestamps`,
        its word map too. `UnreadableText` when its text cannot be read, `InvalidRequest` when
        its markup cannot (`markup.parse`)."""
        loop = asyncio.get_running_loop()
        _, text = await loop.run_in_executor(
            self._g2p_pool,
            self._read,
            request.language,
            request.voice,
            request.text,
            request.timestamps,
            request.normalize,
            request.markup,
            request.lexicon,
        )
        return self._segments(text, pack=request.deadline_ms is not None)

    async def phonemize(
        self,
        text: str,
        language: str | None,
        voice: str,
        normalize: str = "auto",
        markup: str = "auto",
        lexicon: Mapping[str, str] | None = None,
    ) -> tuple[Reading, str, tuple[str, ...]]:
        """What `plan` makes of `text` for `voice`: how it is read, its phonemes and its
        segments (unpacked), nothing voiced (`POST /phonemize`). `UnreadableText` when it
        cannot be read."""
        loop = asyncio.get_running_loop()
        reading, read = await loop.run_in_executor(
            self._g2p_pool, self._read, language, voice, text, False, normalize, markup, lexicon
        )
        return reading, read.phonemes, self._segments(read, pack=False).segments

    def _segments(self, text: marked.Reading, pack: bool) -> SegmentPlan:
        """A read text's parts as segments; the silence asked between parts less the margins
        trimming keeps around speech (so that the quiet between the words is what was
        asked)."""
        segments: list[str] = []
        rates: list[float] = []
        silences: list[int] = []
        margins = self.trim.lead_s + self.trim.tail_s
        for part in text.parts:
            pieces = split_phonemes(part.phonemes, self.engine.max_phonemes, pack=pack)
            segments += pieces
            rates += [part.rate] * len(pieces)
            silences += [_samples(part.pause_s - margins)] + [0] * (len(pieces) - 1)
        silences.append(_samples(text.pause_after_s - margins))
        words = None
        if text.parts and text.parts[0].words is not None:
            words = marked.join_maps([part.words for part in text.parts])
        if len(text.parts) == 1 and text.parts[0].rate == 1 and not any(silences):
            return SegmentPlan(tuple(segments), words)  # plain text
        return SegmentPlan(tuple(segments), words, tuple(rates), tuple(silences))

    def reader(
        self, language: str | None, voice: str, text: str, normalize: str = "auto"
    ) -> Reading:
        """The language `text` is read in for `voice` and the G2P that reads it: the request's
        language, else its voice's and script's (`LanguageG2P.choose`, which makes a language's
        G2P when first asked: in the G2P thread); a G2P that reads one language only (a
        test's) reads every text, whichever language it is said to be in."""
        if isinstance(self.g2p, LanguageG2P):
            chosen, g2p = self.g2p.choose(language, voice, text, normalize)
        else:
            chosen, g2p = choose_language(language, voice, text), self.g2p
        implied = languages.of_voice(voice)
        others = language is not None and (implied is None or implied.name != language)
        if others and chosen.name not in self._spoken_by_others:  # once: not every reply
            self._spoken_by_others.add(chosen.name)
            log.info("no %s voice asked for or loaded: %s speaks it", chosen.label, voice)
        return Reading(chosen, g2p)

    def _read(
        self,
        language: str | None,
        voice: str,
        text: str,
        timestamps: bool,
        normalize: str = "auto",
        markup_mode: str = "auto",
        entries: Mapping[str, str] | None = None,
    ) -> tuple[Reading, marked.Reading]:
        """In the G2P thread: how `text` is read, and what it reads as (with `timestamps`,
        its word maps): its markup, then the lexicon's `entries`. `InvalidRequest` for markup
        that does not parse (`markup.parse`)."""
        items = markup.parse(text, markup_mode, self.symbols, self.max_pause_s)
        if entries:
            items = lexicon.apply(items, entries)
        try:
            reading = self.reader(language, voice, markup.spoken_text(items), normalize)
            return reading, marked.read(items, reading.g2p, timestamps)
        except Exception as exc:  # a bug for this text: it answers as one, not as a crash
            log.exception("text normalisation or G2P failed on %d characters", len(text))
            raise UnreadableText("the text could not be converted to speech sounds") from exc

    async def stream(
        self,
        request: SynthesisRequest,
        key: Hashable,
        received: float | None = None,
        plan: SegmentPlan | None = None,
    ) -> AsyncIterator[bytes]:
        """PCM (s16le, 24 kHz, mono), one chunk per segment; `stream_timed` without words."""
        async for chunk in self.stream_timed(request, key, received, plan):
            if chunk.pcm:
                yield chunk.pcm

    async def stream_timed(
        self,
        request: SynthesisRequest,
        key: Hashable,
        received: float | None = None,
        plan: SegmentPlan | None = None,
    ) -> AsyncGenerator[SegmentAudio]:
        """Audio one chunk per segment, or per window when progressive (audio trimmed to
        nothing yields none), each with the words that end in it when the request asked for
        `timestamps`; cancellable between and during segments (and windows). `received`: when
        the request arrived (perf_counter seconds; default now); `plan`: its `plan`, when the
        caller made it already."""
        explicit = request.deadline_ms is not None
        deadline = (received or time.perf_counter()) + (request.deadline_ms or 0.0) / 1000
        if plan is None:
            plan = await self.plan(request)
        clock = None if plan.words is None else WordClock(plan.words, plan.segments, self.trim)
        sent = 0  # samples
        for index in range(len(plan.segments) + 1):
            silence = plan.silence(index)
            if silence:  # a pause asked for: silence, exactly, before the next words
                deadline += silence / SAMPLE_RATE
                sent += silence
                yield SegmentAudio(bytes(2 * silence))
            if index == len(plan.segments):
                break
            if self.progressive is not None:
                pieces = self._windows(
                    self.progressive, request, key, index, clock, sent, deadline, explicit, plan
                )
            else:
                pieces = self._whole(request, key, index, clock, sent, deadline, explicit, plan)
            async for chunk in pieces:
                deadline += pcm_duration_s(len(chunk.pcm))
                sent += len(chunk.pcm) // 2
                yield chunk

    async def _whole(
        self,
        request: SynthesisRequest,
        key: Hashable,
        index: int,
        clock: WordClock | None,
        sent: int,
        deadline: float,
        explicit: bool,
        plan: SegmentPlan,
    ) -> AsyncIterator[SegmentAudio]:
        """One segment in one engine call."""
        segment = plan.segments[index]
        infer = self.engine.infer_timed if clock is not None else self._untimed
        call = functools.partial(infer, segment, request.voice, plan.speed(index, request.speed))
        timed = await self.scheduler.run(
            key, call, phonemes=len(segment), deadline=deadline, explicit=explicit
        )
        pcm = to_pcm16(self.trim.apply(timed.audio))
        self.scheduler.observe_audio(len(segment), pcm_duration_s(len(pcm)))
        words = None
        if clock is not None:
            words = tuple(clock.segment(index, timed, sent))
        if pcm:
            yield SegmentAudio(pcm, words)

    async def _windows(
        self,
        engine: ProgressiveEngine,
        request: SynthesisRequest,
        key: Hashable,
        index: int,
        clock: WordClock | None,
        sent: int,
        deadline: float,
        explicit: bool,
        plan: SegmentPlan,
    ) -> AsyncIterator[SegmentAudio]:
        """One segment progressively: its front pass, then its windows, one chunk each."""
        segment = plan.segments[index]
        tally = Tally()
        estimate = self.scheduler.speed.estimate(len(segment))
        front = await self.scheduler.run(
            key,
            functools.partial(
                engine.front, segment, request.voice, plan.speed(index, request.speed)
            ),
            deadline=deadline,
            explicit=explicit,
            cost_s=estimate,
            tally=tally,
        )
        per_call, per_frame = self.scheduler.window_speed.line
        speed = Speed(per_call, per_frame, front.frame_samples / SAMPLE_RATE)
        lead = deadline - self.scheduler.clock()
        pause = int(front.durations[0]) if front.durations.size else 0  # the pad before it
        windows = plan_windows(front.frames, self.schedule, speed, lead, pause)
        if log.isEnabledFor(logging.DEBUG):  # which windows a segment's lead gave
            spans = [(w.start, w.end) for w in windows]
            log.debug("segment of %d frames, lead %.2f s: windows %s", front.frames, lead, spans)
        joiner = Joiner(front.frame_samples, self.schedule.crossfade)
        trim = StreamTrim(self.trim)
        decoded: list[npt.NDArray[np.float32]] = []
        total = sum(w.frames for w in windows)
        left = total
        out = 0  # samples yielded for this segment
        for number, window in enumerate(windows):
            audio = await self.scheduler.run(
                key,
                functools.partial(engine.decode, front, window),
                deadline=deadline + out / SAMPLE_RATE,
                explicit=explicit,
                cost_s=estimate * left / total,
                frames=window.frames,
                tally=tally,
            )
            left -= window.frames
            if number == 0:  # the compute before this segment's first audio
                self.scheduler.first_window.observe(len(segment), tally.seconds)
            core = joiner.push(window, audio)
            decoded.append(core)
            last = number == len(windows) - 1
            piece = trim.push(core)
            if last:
                piece = np.concatenate([piece, trim.flush()])
            pcm = to_pcm16(piece)
            words = None
            if clock is not None:
                so_far = Timed(np.concatenate(decoded), front.durations, front.frame_samples)
                words = tuple(clock.segment(index, so_far, sent, complete=last)) or None
            out += len(pcm) // 2
            if pcm or words is not None:
                yield SegmentAudio(pcm, words)
        if not windows and clock is not None:  # nothing to voice: its words last nothing
            silent = Timed(np.zeros(0, np.float32), front.durations, front.frame_samples)
            words = tuple(clock.segment(index, silent, sent))
            if words:
                yield SegmentAudio(b"", words)
        self.scheduler.observe_segment(len(segment), tally)
        self.scheduler.observe_audio(len(segment), out / SAMPLE_RATE)

    def _untimed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        audio = self.engine.infer(phonemes, voice, speed, cancel)
        return Timed(audio, _NO_DURATIONS, 1)

    def close(self) -> None:
        self._g2p_pool.shutdown(wait=False, cancel_futures=True)
        self.scheduler.close()


_NO_DURATIONS = np.zeros(0, np.int64)


def _samples(seconds: float) -> int:
    return max(0, round(seconds * SAMPLE_RATE))
