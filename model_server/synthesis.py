"""Text to PCM for one request: normalise + G2P, split into segments, run each segment through
the shared scheduler, trim, convert. Yields audio segment by segment.

Each segment is needed by a deadline: the request's own (its arrival plus `deadline_ms`, or
its arrival when it names none) for the first, and for each later one that plus the audio
before it, since the listener plays that first."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Hashable
from concurrent.futures import ThreadPoolExecutor

from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.protocol import SynthesisRequest
from model_server.audio import TrimPolicy, to_pcm16
from model_server.engines.base import Engine
from model_server.scheduler import Scheduler
from model_server.text.g2p import G2P
from model_server.text.split import split_phonemes


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

    async def phonemize(self, text: str, pack: bool = False) -> list[str]:
        phonemes = await asyncio.get_running_loop().run_in_executor(self._g2p_pool, self.g2p, text)
        return split_phonemes(phonemes, self.engine.max_phonemes, pack=pack)

    async def stream(
        self, request: SynthesisRequest, key: Hashable, received: float | None = None
    ) -> AsyncIterator[bytes]:
        """PCM (s16le, 24 kHz, mono), one chunk per segment; cancellable between and during
        segments. `received`: when the request arrived (perf_counter seconds; default now)."""
        explicit = request.deadline_ms is not None
        deadline = (received or time.perf_counter()) + (request.deadline_ms or 0.0) / 1000
        for segment in await self.phonemize(request.text, pack=explicit):
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
