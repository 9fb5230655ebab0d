"""A reply's TTS, retried until its first audio (`gateway.retry`) and resumed after it, over
any transport whose sessions carry model-server frames.

A stream that fails with a retryable error before any audio came back (the model server
restarting or killed, a SageMaker `ModelNotReadyException`, throttling, a mid-stream
`ModelStreamError`, `tts_timeout`) is opened again (the pool may pick another server) and sent
every chunk not complete, with what is left of each chunk's deadline; a batch call is made
again. Retries stop at the reply's first-audio deadline.

Once audio has flowed, a stream over a pool of model servers that fails retryably (lost,
`tts_stalled`: a frozen server) resumes at once where the listener is, while tries are left:
opened again (the pool avoids the server that wedged), sent the chunks not yet completed, and
the audio of the first one already heard is dropped by its byte count (the same text, voice
and speed give the same audio), so it continues without a repeat or a hole; word timings are
on the reply's clock and not given twice. A chunk's completion keeps its index in the reply.
When it cannot resume (no server is up, no tries left) the reply ends with a retryable
`error`.

The stream is `framed_stream.FramedTTSStream` with a `Resumption`; what was sent, completed
and heard is its session core's record (`tts_session.TTSSession`), and each retry is the
budget's one decision (`RetryBudget.next_try`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from gateway.errors import TTSError
from gateway.retry import RetryBudget
from gateway.transports.base import BatchTransport, OnComplete, Piece, SessionTransport
from gateway.transports.framed_stream import FramedTTSStream, Resumption
from kokoro_contract.protocol import TextOptions


class ResumingTransport:
    def __init__(
        self,
        bidi: SessionTransport,
        batch: BatchTransport,
        budget: RetryBudget,
        resume_after_audio: bool = True,
    ) -> None:
        """`budget`: the reply's tries, until its first-audio deadline (`RetryBudget`);
        `resume_after_audio`: whether a stream may resume once audio has flowed (a pool of
        model servers, which can choose another; not SageMaker's one endpoint)."""
        self.bidi = bidi
        self.batch = batch
        self.budget = budget
        self.resume_after_audio = resume_after_audio

    def open(
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> FramedTTSStream:
        resumption = Resumption(self.bidi.connect, self.budget, self.resume_after_audio)
        return FramedTTSStream(
            None,
            voice,
            speed,
            on_complete,
            timestamps=timestamps,
            resumption=resumption,
            options=options,
        )

    async def synthesize(
        self,
        text: str,
        voice: str | None,
        speed: float,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncGenerator[Piece]:
        budget = self.budget
        while True:
            try:
                async with contextlib.aclosing(
                    self.batch.synthesize(text, voice, speed, timestamps, options)
                ) as pieces:
                    async for piece in pieces:
                        budget.started = budget.started or isinstance(piece, bytes)
                        yield piece
                return
            except TTSError as exc:
                wait = budget.next_try(exc)
                if wait is None:
                    raise
                await asyncio.sleep(wait)
