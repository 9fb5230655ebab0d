"""Text to PCM for one request: normalise + G2P, split into segments, run each segment through
the shared scheduler, trim, convert. Yields audio segment by segment.

Each segment is needed by a deadline: the request's own (its arrival plus `deadline_ms`, or
its arrival when it names none) for the first, and for each later one that plus the audio
before it, since the listener plays that first."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor

from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.protocol import SynthesisRequest
from model_server.audio import TrimPolicy, to_pcm16
from model_server.engines.base import Engine
from model_server.errors import UnreadableText
from model_server.scheduler import Scheduler
from model_server.text.g2p import G2P
from model_server.text.split import split_phonemes

log = logging.getLogger(__name__)


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

    async def plan(self, request: SynthesisRequest) -> list[str]:
        """The request's text as the engine's segments: normalised, phonemized and split (packed
        when the request names a deadline). `UnreadableText` when its text cannot be read."""
        loop = asyncio.get_running_loop()
        phonemes = await loop.run_in_executor(self._g2p_pool, self._phonemes, request.text)
        return split_phonemes(
            phonemes, self.engine.max_phonemes, pack=request.deadline_ms is not None
        )

    def _phonemes(self, text: str) -> str:
        try:
            return self.g2p(text)
        except Exception as exc:  # a bug for this text: it answers as one, not as a crash
            log.exception("text normalisation or G2P failed on %d characters", len(text))
            raise UnreadableText("the text could not be converted to speech sounds") from exc

    async def stream(
        self,
        request: SynthesisRequest,
        key: Hashable,
        received: float | None = None,
        segments: Sequence[str] | None = None,
    ) -> AsyncIterator[bytes]:
        """PCM (s16le, 24 kHz, mono), one chunk per segment; cancellable between and during
        segments. `received`: when the request arrived (perf_counter seconds; default now);
        `segments`: its `plan`, when the caller made it already."""
        explicit = request.deadline_ms is not None
        deadline = (received or time.perf_counter()) + (request.deadline_ms or 0.0) / 1000
        if segments is None:
            segments = await self.plan(request)
        for segment in segments:
            infer = functools.partial(self.engine.infer, segment, request.voice, request.speed)
            audio = await self.scheduler.run(
                key, infer, phonemes=len(segment), deadline=deadline, explicit=explicit
            )
            pcm = to_pcm16(self.trim.apply(audio))
            self.scheduler.observe_audio(len(segment), pcm_duration_s(len(pcm)))
            if pcm:
                deadline += pcm_duration_s(len(pcm))
                yield pcm

    def close(self) -> None:
        self._g2p_pool.shutdown(wait=False, cancel_futures=True)
        self.scheduler.close()
