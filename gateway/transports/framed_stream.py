"""One reply's TTS stream over model-server sessions (the model server's WebSocket, SageMaker's
bidirectional stream): the adapter around the session core (`tts_session.TTSSession`), and the
only one. It owns the I/O: each attempt's session (a `FrameCarrier`), the wait for the next
frame, the resume, and telling the reply of each chunk it completes; the core holds the record
(chunks by index, completions, first audio, what the listener has, what a resume sends) and
decides what each event means.

Chunks go out as `kokoro_contract.protocol` requests the moment they are ready; frames coming
back are read by the frame rule (a JSON object is control, anything else is audio). The wait
for the next frame is limited while chunks are pending: `tts_timeout_s` past the earliest one's
due time (its deadline, or when it was sent) it fails with `tts_timeout`. Each chunk's
completion is told to the reply (`on_complete`) under its index in the reply, with how long
its synthesis took and how long its first audio took from the same start (the server's elapsed
time less what came after the first audio frame here), and to the session's owner
(`FrameCarrier.progressed`: the pool, whose waiting replies look again).

A stream that may resume (`Resumption`, what `transports/resuming.py` opens) is given a way to
open sessions and the reply's `RetryBudget`: it opens its first session (tried again before
anything was said), and when an attempt fails it asks the budget once (`RetryBudget.next_try`)
whether another follows: after a wait before any audio (from every chunk not complete), or at
once after it where sessions can be opened elsewhere (a pool): the core sends the unfinished
chunks and gives nothing twice. Otherwise, and for a stream over one given session, the error
ends the reply.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from types import TracebackType

from gateway.aio import POKED, Inbox, loop_time
from gateway.errors import TTSError
from gateway.retry import RetryBudget
from gateway.transports.base import OnComplete, Piece
from gateway.transports.tts_session import (
    Action,
    Complete,
    Deliver,
    Fail,
    SendRequest,
    TTSSession,
)
from kokoro_contract import protocol
from kokoro_contract.protocol import TextOptions

INBOX_FRAMES = 32  # frames read ahead of the reply: past this the reader waits, so a client
# that stops reading stops the model server's stream too (TCP backpressure), not gateway memory

SendFrameFn = Callable[[str], Awaitable[None]]


class FrameCarrier:
    """One model-server session as a reply's stream sees it: how to send a frame, and the
    frames its reader received, in order (at most `INBOX_FRAMES` waiting), or why it ended."""

    def __init__(self, send_frame: SendFrameFn, tts_timeout_s: float | None = None) -> None:
        """`tts_timeout_s`: how long past a pending chunk's due time the stream waits for the
        session's next frame (None: no limit)."""
        self.send_frame = send_frame
        self.tts_timeout_s = tts_timeout_s
        # told after each chunk of this session completes (the pool: its waiting replies
        # look again, the reply's spare time having grown)
        self.progressed: Callable[[], None] | None = None
        self._inbox: Inbox[bytes | str | TTSError] = Inbox(INBOX_FRAMES)

    async def received(self, frame: bytes | str) -> None:
        await self._inbox.put(frame)

    async def failed(self, error: TTSError) -> None:
        """The session ended (lost, closed, stalled): `error` after the frames before it."""
        await self._inbox.put(error)

    def poke(self) -> None:
        """The stream's reader should look again (a chunk sent, the input ended)."""
        self._inbox.poke()

    async def next(self) -> bytes | str | TTSError | None:
        """The next frame, or the session's end; None: poked."""
        item = await self._inbox.get()
        return None if item is POKED else item


Connect = Callable[[], AbstractAsyncContextManager[FrameCarrier]]


@dataclass(frozen=True)
class Resumption:
    """How a stream opens its sessions again: `connect` opens one (the pool fails over inside
    it), `budget` is the reply's tries, `after_audio` whether a session may be opened again
    once audio has flowed (a pool, which can choose another server; not SageMaker's one
    endpoint)."""

    connect: Connect
    budget: RetryBudget
    after_audio: bool = True


class FramedTTSStream:
    def __init__(
        self,
        send_frame: SendFrameFn | FrameCarrier | None,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        tts_timeout_s: float | None = None,
        timestamps: bool = False,
        clock: Callable[[], float] | None = None,
        resumption: Resumption | None = None,
        options: TextOptions | None = None,
    ) -> None:
        """Over one session: `send_frame` sends its frames (a `FrameCarrier` given whole), and
        its reader gives what comes back to `received`/`failed`. With `resumption` (no
        session given), over sessions it opens itself, as an async context manager.
        `tts_timeout_s`: see `FrameCarrier`; `clock` times each chunk's first audio (the
        running loop's by default)."""
        self._core = TTSSession(voice, speed, timestamps, clock or loop_time, options=options)
        self._on_complete = on_complete
        self._resumption = resumption
        self._carrier: FrameCarrier | None
        if send_frame is None or isinstance(send_frame, FrameCarrier):
            self._carrier = send_frame
        else:
            self._carrier = FrameCarrier(send_frame, tts_timeout_s)
        self._stack: contextlib.AsyncExitStack | None = None  # the current session's
        self._lock = asyncio.Lock()  # sends wait while a session is opened again

    @classmethod
    def on(
        cls,
        carrier: FrameCarrier,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> FramedTTSStream:
        """A stream over the one session `carrier`."""
        return cls(carrier, voice, speed, on_complete, timestamps=timestamps, options=options)

    @property
    def session(self) -> TTSSession:
        """The record: what was sent, what came back, what the listener has."""
        return self._core

    # --- the sessions of a stream that may resume --------------------------------------------

    async def __aenter__(self) -> FramedTTSStream:
        if self._carrier is None:
            await self._connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        """The current session closes as the reply leaves: completed, or cancelled (barge-in,
        disconnect, failure) so the model server stops its work."""
        stack, self._stack = self._stack, None
        if stack is not None:
            return bool(await stack.__aexit__(exc_type, exc, tb))
        return False

    async def _connect(self) -> None:
        """Open a session, tried again while the budget allows (before anything was said)."""
        assert self._resumption is not None
        while True:
            stack = contextlib.AsyncExitStack()
            try:
                self._carrier = await stack.enter_async_context(self._resumption.connect())
            except TTSError as exc:
                wait = self._resumption.budget.next_try(exc)
                if wait is None:
                    raise
                await asyncio.sleep(wait)
                continue
            self._stack = stack
            return

    async def _resume(self, error: TTSError) -> None:
        """After `error`: a new session and the core's resume, if the budget allows one (at
        once after audio, after its wait before); otherwise the reply fails with `error`."""
        resumption = self._resumption
        if resumption is None:
            raise error
        budget = resumption.budget
        async with self._lock:  # sends wait, then go to the new session
            wait = budget.next_try(error, resumable=resumption.after_audio)
            if wait is None:
                raise error
            stack, self._stack = self._stack, None
            if stack is not None:  # the failed attempt: cancel whatever is left of it
                with contextlib.suppress(Exception):
                    await stack.__aexit__(type(error), error, error.__traceback__)
            await asyncio.sleep(wait)
            try:
                await self._connect()
                await self._carry(self._core.resume(loop_time()))
            except TTSError:
                if budget.started:  # nowhere to resume: the reply ends with why it stopped
                    raise error from None
                raise

    async def _carry(self, actions: list[Action]) -> None:
        assert self._carrier is not None
        for action in actions:
            if isinstance(action, SendRequest):
                await self._carrier.send_frame(action.frame)

    # --- TTSStream --------------------------------------------------------------------------

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        async with self._lock:
            carrier = self._carrier
            assert carrier is not None
            try:
                await self._carry(self._core.send(text, deadline_ms, loop_time()))
            except TTSError as exc:
                self._core.failed(exc)
                if self._resumption is None or not exc.retryable:
                    raise
                # the session is gone: the audio side resumes, with this chunk
            # a wait begun with nothing pending has no limit: it starts again, with one
            carrier.poke()

    async def end_input(self) -> None:
        async with self._lock:
            self._core.end_input()
            if self._carrier is not None:
                self._carrier.poke()

    async def audio(self) -> AsyncIterator[Piece]:
        """PCM of every chunk, in order, and word timings before the audio they describe (held
        until the first audio). The only side that resumes: a send that fails leaves it to the
        session's failure (or its `tts_timeout`, `tts_stalled`), which surfaces here."""
        while True:
            try:
                async for piece in self._attempt():
                    yield piece
                return
            except TTSError as exc:
                await self._resume(exc)

    async def _attempt(self) -> AsyncIterator[Piece]:
        core = self._core
        carrier = self._carrier
        assert carrier is not None
        while not core.finished:
            if core.failure is not None:
                raise core.failure
            frame = await self._next(carrier)
            if frame is None:
                continue
            if isinstance(frame, TTSError):
                actions = core.failed(frame)
            elif isinstance(frame, TimeoutError):
                actions = core.stalled(carrier.tts_timeout_s or 0.0)
            else:
                actions = core.received(frame)
            for action in actions:
                match action:
                    case Deliver(piece=piece):
                        if isinstance(piece, bytes) and self._resumption is not None:
                            self._resumption.budget.started = True
                        yield piece
                    case Complete(done=done):
                        if self._on_complete is not None:
                            self._on_complete(done)
                        if carrier.progressed is not None:
                            carrier.progressed()
                    case Fail(error=error):
                        raise error
        for action in core.finish():
            if isinstance(action, Deliver):
                yield action.piece

    async def _next(self, carrier: FrameCarrier) -> bytes | str | TTSError | TimeoutError | None:
        """The session's next frame; while chunks are pending, no longer than `tts_timeout_s`
        past the earliest one's due time (every frame restarts the wait): a TimeoutError."""
        due = self._core.due_at()
        if carrier.tts_timeout_s is None or due is None:
            return await carrier.next()
        patience = max(0.0, due - loop_time()) + carrier.tts_timeout_s
        try:
            async with asyncio.timeout(patience):
                return await carrier.next()
        except TimeoutError as silent:
            return silent

    async def cancel(self) -> None:
        assert self._carrier is not None
        await self._carrier.send_frame(protocol.cancel_message())

    async def close(self) -> None:
        assert self._carrier is not None
        await self._carrier.send_frame(protocol.close_message())

    # --- for the reader of a session given whole ---------------------------------------------

    async def received(self, frame: bytes | str) -> None:
        assert self._carrier is not None
        await self._carrier.received(frame)

    async def failed(self, error: TTSError) -> None:
        assert self._carrier is not None
        await self._carrier.failed(error)


@contextlib.asynccontextmanager
async def open_stream(
    connect: Connect,
    voice: str | None,
    speed: float,
    on_complete: OnComplete | None = None,
    timestamps: bool = False,
    options: TextOptions | None = None,
) -> AsyncIterator[FramedTTSStream]:
    """A stream over one session `connect` opens (`BidiTransport.open` for the transports
    whose sessions carry model-server frames); it closes with the stream."""
    async with connect() as carrier:
        yield FramedTTSStream.on(carrier, voice, speed, on_complete, timestamps, options)


class FramedSessions:
    """`BidiTransport.open` for a `SessionTransport`: a reply's stream over the sessions its
    `connect` opens (the model server's WebSocket, SageMaker's bidi stream, the pool's
    placement)."""

    def connect(self) -> AbstractAsyncContextManager[FrameCarrier]:
        raise NotImplementedError

    def open(
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AbstractAsyncContextManager[FramedTTSStream]:
        return open_stream(self.connect, voice, speed, on_complete, timestamps, options)
