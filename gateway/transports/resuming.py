"""A reply's TTS, retried until its first audio (`gateway.retry`), over any transport.

A stream that fails with a retryable error before any audio came back (the model server
restarting or killed, a SageMaker `ModelNotReadyException`, throttling, a mid-stream
`ModelStreamError`, `tts_timeout`) is closed, opened again (the pool may pick another server)
and sent every chunk sent so far, with what is left of each chunk's deadline; a batch call is
made again. Retries stop at the reply's first-audio deadline. Once audio has flowed, a failure
passes through: the reply ends with a retryable `error`, never a silent repeat.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from types import TracebackType

from gateway.errors import TTSError
from gateway.retry import RetryBudget, retrying
from gateway.transports.base import (
    BatchTransport,
    BidiTransport,
    OnComplete,
    Piece,
    TimedWords,
    TTSStream,
)


@dataclass
class _Sent:
    text: str
    deadline_ms: float | None
    at: float  # loop time it was first sent


class ResumingTransport:
    def __init__(self, bidi: BidiTransport, batch: BatchTransport, budget: RetryBudget) -> None:
        """`budget`: the reply's tries, until its first-audio deadline (`RetryBudget`)."""
        self.bidi = bidi
        self.batch = batch
        self.budget = budget

    def open(
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
    ) -> _ResumingStream:
        return _ResumingStream(self, voice, speed, on_complete, timestamps)

    async def synthesize(
        self, text: str, voice: str | None, speed: float, timestamps: bool = False
    ) -> AsyncGenerator[Piece]:
        budget = self.budget
        while True:
            try:
                async with contextlib.aclosing(
                    self.batch.synthesize(text, voice, speed, timestamps)
                ) as pieces:
                    async for piece in pieces:
                        budget.started = budget.started or isinstance(piece, bytes)
                        yield piece
                return
            except TTSError as exc:
                wait = budget.retry_after(exc)
                if wait is None:
                    raise
                await asyncio.sleep(wait)


class _ResumingStream:
    """The `TTSStream` a reply sees; behind it, the current attempt's stream."""

    def __init__(
        self,
        owner: ResumingTransport,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None,
        timestamps: bool = False,
    ) -> None:
        self._owner = owner
        self._timestamps = timestamps
        self._voice = voice
        self._speed = speed
        self._on_complete = on_complete
        self._sent: list[_Sent] = []
        self._ended = False
        self._lock = asyncio.Lock()  # sends wait while the stream is opened again
        self._stack: contextlib.AsyncExitStack | None = None
        self._stream: TTSStream | None = None

    async def __aenter__(self) -> _ResumingStream:
        await self._open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """The current attempt's stream closes as the reply leaves: completed, or cancelled
        (barge-in, disconnect, failure) so the model server stops its work."""
        stack, self._stack = self._stack, None
        if stack is not None:
            return bool(await stack.__aexit__(exc_type, exc, tb))
        return False

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        owner = self._owner

        async def attempt() -> None:
            stack = contextlib.AsyncExitStack()
            opened = owner.bidi.open(self._voice, self._speed, self._on_complete, self._timestamps)
            self._stream = await stack.enter_async_context(opened)
            self._stack = stack

        await retrying(attempt, owner.budget)
        for sent in self._sent:  # what the failed attempt was asked, again
            left_ms = None
            if sent.deadline_ms is not None:
                left_ms = max(0.0, sent.deadline_ms - (loop.time() - sent.at) * 1000)
            assert self._stream is not None
            await self._stream.send(sent.text, left_ms)
        if self._ended:
            assert self._stream is not None
            await self._stream.end_input()

    async def _resume(self, error: TTSError) -> None:
        """Open the stream again after `error`, unless the reply must fail now: audio was
        heard, the error is final, or no tries or time are left."""
        async with self._lock:  # sends wait, then go to the new stream
            wait = self._owner.budget.retry_after(error)
            if wait is None:
                raise error
            stack, self._stack = self._stack, None
            if stack is not None:  # the failed attempt: cancel whatever is left of it
                with contextlib.suppress(Exception):
                    await stack.__aexit__(type(error), error, error.__traceback__)
            await asyncio.sleep(wait)
            await self._open()

    # --- TTSStream --------------------------------------------------------------------------

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        async with self._lock:
            self._sent.append(_Sent(text, deadline_ms, asyncio.get_running_loop().time()))
            assert self._stream is not None
            try:
                await self._stream.send(text, deadline_ms)
            except TTSError as exc:
                if self._owner.budget.started or not exc.retryable:
                    raise
                # the session is gone: its audio side fails too, and resumes with this chunk

    async def end_input(self) -> None:
        async with self._lock:
            self._ended = True
            assert self._stream is not None
            with contextlib.suppress(TTSError):  # a lost session: resumed from audio()
                await self._stream.end_input()

    async def audio(self) -> AsyncIterator[Piece]:
        """The only side that resumes: a send that fails leaves it to the stream's failure
        (or its `tts_timeout`), which surfaces here. Word timings wait for the first audio,
        so an attempt given up on leaves none behind."""
        while True:
            assert self._stream is not None
            held: list[TimedWords] = []
            try:
                async for piece in self._stream.audio():
                    budget = self._owner.budget
                    if isinstance(piece, TimedWords) and not budget.started:
                        held.append(piece)
                        continue
                    if not budget.started:
                        budget.started = True
                        for words in held:
                            yield words
                        held.clear()
                    yield piece
                for words in held:  # timings of a stream that sent no audio at all
                    yield words
                return
            except TTSError as exc:
                await self._resume(exc)
