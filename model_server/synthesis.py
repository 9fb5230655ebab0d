"""Text to PCM for one request: normalise + G2P, split into segments, run each segment through
the shared scheduler, trim, convert. Yields audio segment by segment."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Hashable
from concurrent.futures import ThreadPoolExecutor

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

    async def phonemize(self, text: str) -> list[str]:
        phonemes = await asyncio.get_running_loop().run_in_executor(self._g2p_pool, self.g2p, text)
        return split_phonemes(phonemes, self.engine.max_phonemes)

    async def stream(self, request: SynthesisRequest, key: Hashable) -> AsyncIterator[bytes]:
        """PCM (s16le, 24 kHz, mono), one chunk per segment; cancellable between and during
        segments."""
        for segment in await self.phonemize(request.text):
            infer = functools.partial(self.engine.infer, segment, request.voice, request.speed)
            audio = await self.scheduler.run(key, infer)
            pcm = to_pcm16(self.trim.apply(audio))
            if pcm:
                yield pcm

    def close(self) -> None:
        self._g2p_pool.shutdown(wait=False, cancel_futures=True)
        self.scheduler.close()
