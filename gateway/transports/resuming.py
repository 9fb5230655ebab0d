"""A reply's TTS, retried until its first audio (`gateway.retry`) and resumed after it, over
any transport.

A stream that fails with a retryable error before any audio came back (the model server
restarting or killed, a SageMaker `ModelNotReadyException`, throttling, a mid-stream
`ModelStreamError`, `tts_timeout`) is closed, opened again (the pool may pick another server)
and sent every chunk sent so far, with what is left of each chunk's deadline; a batch call is
made again. Retries stop at the reply's first-audio deadline.

Once audio has flowed, a stream over a pool of model servers that fails retryably (lost,
`tts_stalled`: a frozen server) resumes at once where the listener is, while tries are left:
opened again (the pool avoids the server that wedged), sent the chunks not yet completed, and
the audio of the first one already heard is dropped by its byte count (the same text, voice
and speed give the same audio), so it continues without a repeat or a hole; word timings are
shifted to the reply's clock and not given twice. A chunk's completion keeps its index in the
reply. When it cannot resume (no server is up, no tries left) the reply ends with a retryable
`error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from types import TracebackType

from gateway.errors import TTSError
from gateway.retry import RetryBudget, retrying
from gateway.transports.base import (
    BatchTransport,
    BidiTransport,
    Completed,
    OnComplete,
    Piece,
    TimedWords,
    TTSStream,
)
from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.protocol import WordTiming


@dataclass
class _Sent:
    text: str
    deadline_ms: float | None
    at: float  # loop time it was first sent


class ResumingTransport:
    def __init__(
        self,
        bidi: BidiTransport,
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
        self._done = 0  # chunks completed: all their audio has gone to the reply
        self._done_bytes = 0  # the PCM of those
        self._yielded = 0  # PCM given to the reply
        self._words_at = -1  # PCM position of the last word timings given to the reply
        self._base = 0  # the current attempt's first chunk, as the reply counts chunks
        self._base_bytes = 0  # where its audio starts in the reply's PCM
        self._heard = 0  # of its audio, bytes the reply has had already (not given again)
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
            opened = owner.bidi.open(self._voice, self._speed, self._completed, self._timestamps)
            self._stream = await stack.enter_async_context(opened)
            self._stack = stack

        await retrying(attempt, owner.budget)
        for sent in self._sent[self._base :]:  # what the failed attempt was asked, again
            left_ms = None
            if sent.deadline_ms is not None:
                left_ms = max(0.0, sent.deadline_ms - (loop.time() - sent.at) * 1000)
            assert self._stream is not None
            await self._stream.send(sent.text, left_ms)
        if self._ended:
            assert self._stream is not None
            await self._stream.end_input()

    def _completed(self, done: Completed) -> None:
        """A chunk of the current attempt is complete: counted, and told to the reply under
        its index in the reply."""
        self._done = self._base + done.index + 1
        self._done_bytes += done.audio_bytes
        if self._on_complete is not None:
            self._on_complete(dataclasses.replace(done, index=self._base + done.index))

    async def _resume(self, error: TTSError) -> None:
        """Open the stream again after `error`: from the start before any audio (after a
        wait, while tries and time are left), from the first chunk not completed after it
        (at once, while tries are left); otherwise the reply fails with `error` now."""
        async with self._lock:  # sends wait, then go to the new stream
            budget = self._owner.budget
            if budget.started:
                if not (self._owner.resume_after_audio and budget.may_resume(error)):
                    raise error
                wait = 0.0
                self._base, self._base_bytes = self._done, self._done_bytes
            else:
                maybe = budget.retry_after(error)
                if maybe is None:
                    raise error
                wait = maybe
                self._base = self._base_bytes = self._done = self._done_bytes = 0
            self._heard = self._yielded - self._base_bytes
            stack, self._stack = self._stack, None
            if stack is not None:  # the failed attempt: cancel whatever is left of it
                with contextlib.suppress(Exception):
                    await stack.__aexit__(type(error), error, error.__traceback__)
            await asyncio.sleep(wait)
            try:
                await self._open()
            except TTSError:
                if budget.started:  # nowhere to resume: the reply ends with why it stopped
                    raise error from None
                raise

    # --- TTSStream --------------------------------------------------------------------------

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        async with self._lock:
            self._sent.append(_Sent(text, deadline_ms, asyncio.get_running_loop().time()))
            assert self._stream is not None
            try:
                await self._stream.send(text, deadline_ms)
            except TTSError as exc:
                if not exc.retryable:
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
        (or its `tts_timeout`, `tts_stalled`), which surfaces here. Word timings wait for the
        first audio, so an attempt given up on before it leaves none behind."""
        budget = self._owner.budget
        while True:
            assert self._stream is not None
            held: list[TimedWords] = []
            given = 0  # PCM of this attempt so far, heard before or not
            try:
                async for piece in self._stream.audio():
                    if isinstance(piece, TimedWords):
                        at = self._base_bytes + given
                        if at <= self._words_at:
                            continue  # the reply had these before this attempt
                        piece = _shifted(piece, pcm_duration_s(self._base_bytes))
                        if not budget.started:
                            held.append(piece)
                            continue
                        self._words_at = at
                        yield piece
                        continue
                    before, given = given, given + len(piece)
                    if given <= self._heard:
                        continue  # heard before this attempt
                    piece = piece[max(0, self._heard - before) :]
                    if not budget.started:
                        budget.started = True
                        for words in held:
                            self._words_at = self._base_bytes
                            yield words
                        held.clear()
                    self._yielded += len(piece)
                    yield piece
                for words in held:  # timings of a stream that sent no audio at all
                    yield words
                return
            except TTSError as exc:
                await self._resume(exc)


def _shifted(timed: TimedWords, by_s: float) -> TimedWords:
    """Timings of an attempt's stream on the reply's clock: that stream's first sample is
    `by_s` into the reply."""
    if not by_s:
        return timed
    return TimedWords(tuple(WordTiming(w.word, w.start + by_s, w.end + by_s) for w in timed.words))
