"""Text to PCM for one request: normalise + G2P, split into segments, run each segment through
the shared scheduler, trim, convert. Yields audio segment by segment (with `timestamps`, each
segment's word timings beside it: `timings.py`).

Each segment is needed by a deadline: the request's own (its arrival plus `deadline_ms`, or
its arrival when it names none) for the first, and for each later one that plus the audio
before it, since the listener plays that first."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Hashable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.protocol import SynthesisRequest, WordTiming
from model_server.audio import TrimPolicy, to_pcm16
from model_server.engines.base import CancelToken, Engine, Timed
from model_server.errors import UnreadableText
from model_server.scheduler import Scheduler
from model_server.text.g2p import G2P
from model_server.text.split import split_phonemes
from model_server.text.words import WordMap, map_words
from model_server.timings import WordClock

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Plan:
    """What the engine is asked to voice for a request: its segments, in order; with
    `timestamps`, which phonemes voice which word."""

    segments: tuple[str, ...]
    words: WordMap | None = None


@dataclass(frozen=True)
class Chunk:
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
    ) -> None:
        self.engine = engine
        self.g2p = g2p
        self.scheduler = scheduler
        self.trim = trim or TrimPolicy()
        # G2P is quick but espeak-ng is single-threaded: one thread, off the event loop.
        self._g2p_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="g2p")

    async def plan(self, request: SynthesisRequest) -> Plan:
        """The request's text as the engine's segments: normalised, phonemized and split (packed
        when the request names a deadline); with `timestamps`, its word map too.
        `UnreadableText` when its text cannot be read."""
        loop = asyncio.get_running_loop()
        phonemes, words = await loop.run_in_executor(
            self._g2p_pool, self._phonemes, request.text, request.timestamps
        )
        segments = split_phonemes(
            phonemes, self.engine.max_phonemes, pack=request.deadline_ms is not None
        )
        return Plan(tuple(segments), words)

    def _phonemes(self, text: str, timestamps: bool) -> tuple[str, WordMap | None]:
        try:
            phonemes = self.g2p(text)
        except Exception as exc:  # a bug for this text: it answers as one, not as a crash
            log.exception("text normalisation or G2P failed on %d characters", len(text))
            raise UnreadableText("the text could not be converted to speech sounds") from exc
        if not timestamps:
            return phonemes, None
        try:
            return phonemes, map_words(text, phonemes, self.g2p)
        except Exception:  # timings are an aid: the audio goes out, with no words
            log.exception("word map failed on %d characters", len(text))
            return phonemes, WordMap(phonemes, (), ())

    async def stream(
        self,
        request: SynthesisRequest,
        key: Hashable,
        received: float | None = None,
        plan: Plan | None = None,
    ) -> AsyncIterator[bytes]:
        """PCM (s16le, 24 kHz, mono), one chunk per segment; `stream_timed` without words."""
        async for chunk in self.stream_timed(request, key, received, plan):
            yield chunk.pcm

    async def stream_timed(
        self,
        request: SynthesisRequest,
        key: Hashable,
        received: float | None = None,
        plan: Plan | None = None,
    ) -> AsyncIterator[Chunk]:
        """Audio one chunk per segment (a segment trimmed to nothing yields none), each with
        the words that end in it when the request asked for `timestamps`; cancellable between
        and during segments. `received`: when the request arrived (perf_counter seconds;
        default now); `plan`: its `plan`, when the caller made it already."""
        explicit = request.deadline_ms is not None
        deadline = (received or time.perf_counter()) + (request.deadline_ms or 0.0) / 1000
        if plan is None:
            plan = await self.plan(request)
        clock = None if plan.words is None else WordClock(plan.words, plan.segments, self.trim)
        sent = 0  # samples
        for index, segment in enumerate(plan.segments):
            infer = self.engine.infer_timed if clock is not None else self._untimed
            call = functools.partial(infer, segment, request.voice, request.speed)
            timed = await self.scheduler.run(
                key, call, phonemes=len(segment), deadline=deadline, explicit=explicit
            )
            pcm = to_pcm16(self.trim.apply(timed.audio))
            self.scheduler.observe_audio(len(segment), pcm_duration_s(len(pcm)))
            words = None
            if clock is not None:
                words = tuple(clock.segment(index, timed, sent))
            if pcm:
                deadline += pcm_duration_s(len(pcm))
                sent += len(pcm) // 2
                yield Chunk(pcm, words)

    def _untimed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        audio = self.engine.infer(phonemes, voice, speed, cancel)
        return Timed(audio, _NO_DURATIONS, 1)

    def close(self) -> None:
        self._g2p_pool.shutdown(wait=False, cancel_futures=True)
        self.scheduler.close()


_NO_DURATIONS = np.zeros(0, np.int64)
