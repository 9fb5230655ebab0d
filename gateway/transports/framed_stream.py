"""One reply's TTS stream over any carrier of model-server frames (the model server's
WebSocket, SageMaker's bidirectional stream): chunks go out as `kokoro_contract.protocol`
requests the moment they are ready; frames coming back are read by the frame rule (a JSON
object is control, anything else is audio) and tracked until every chunk sent is complete.
Each chunk's completion says how long its synthesis took and how long its first audio took
(from the same start: the server's elapsed time less what came after the first audio frame),
which is how a reply learns whether the engine speaks progressively."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

from gateway.errors import TTSError, model_server_error
from gateway.transports.base import Completed, OnComplete, Piece, TimedWords
from kokoro_contract import protocol
from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.protocol import (
    CancelledMsg,
    CompleteMsg,
    ErrorMsg,
    StartMsg,
    WordTiming,
    WordTimingsMsg,
)

_INPUT_DONE = object()
_DUE = object()  # a chunk was sent: the wait for the next frame counts from its due time too
RETRYABLE_CODES = frozenset({"not_ready", "overloaded"})
INBOX_FRAMES = 32  # frames read ahead of the reply: past this the reader waits, so a client
# that stops reading stops the model server's stream too (TCP backpressure), not gateway memory


class FramedTTSStream:
    def __init__(
        self,
        send_frame: Callable[[str], Awaitable[None]],
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        tts_timeout_s: float | None = None,
        timestamps: bool = False,
        clock: Callable[[], float] | None = None,
    ) -> None:
        """`tts_timeout_s`: how long past a pending chunk's due time (its deadline, or when it
        was sent) the stream waits for its next frame before failing with `tts_timeout`;
        `clock` times each chunk's first audio (the running loop's by default)."""
        self._clock = clock
        self._send_frame = send_frame
        self._tts_timeout_s = tts_timeout_s
        self._timestamps = timestamps
        self._yielded = 0  # PCM bytes out so far: where each request's audio starts
        self._starts: dict[str, float] = {}  # request id -> seconds its first sample is at
        self._due: dict[str, float] = {}  # request id -> loop time its first audio is due
        self._voice = voice
        self._speed = speed
        self._on_complete = on_complete
        self._prefix = uuid.uuid4().hex[:12]
        self._counter = itertools.count()
        self._pending: dict[str, tuple[int, int]] = {}  # request id -> (index, characters)
        self._current: str | None = None  # the request whose audio is coming now
        self._first_at: dict[str, float] = {}  # request id -> loop time of its first audio
        self._first_bytes: dict[str, int] = {}  # request id -> PCM in its first audio frame
        self._inbox: asyncio.Queue[bytes | str | TTSError | object] = asyncio.Queue(INBOX_FRAMES)

    # --- for the reply ----------------------------------------------------------------------

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        index = next(self._counter)
        rid = f"{self._prefix}-{index}"
        self._pending[rid] = (index, len(text))
        self._due[rid] = asyncio.get_running_loop().time() + (deadline_ms or 0.0) / 1000
        message = protocol.synthesize_message(
            text, rid, self._voice, self._speed, deadline_ms, self._timestamps
        )
        await self._send_frame(message)
        # a wait begun with nothing pending has no limit: it starts again, with one (a full
        # inbox has frames to read, and each read starts it again anyway)
        with contextlib.suppress(asyncio.QueueFull):
            self._inbox.put_nowait(_DUE)

    async def end_input(self) -> None:
        await self._inbox.put(_INPUT_DONE)

    async def audio(self) -> AsyncIterator[Piece]:
        clock = self._clock or asyncio.get_running_loop().time
        input_done = False
        while not (input_done and not self._pending):
            item = await self._next()
            if item is _INPUT_DONE:
                input_done = True
                continue
            if item is _DUE:
                continue
            if isinstance(item, TTSError):
                raise item
            assert isinstance(item, bytes | str)
            match protocol.read_server_frame(item):
                case bytes() as pcm:
                    self._yielded += len(pcm)
                    if self._current is not None and self._current not in self._first_at:
                        self._first_at[self._current] = clock()
                        self._first_bytes[self._current] = len(pcm)
                    yield pcm
                case StartMsg(request_id=rid):
                    self._current = rid
                    # a request's audio follows the one before it: it starts where that ended
                    # (not where its first words come: a progressive server may send a window
                    # that ends no word before them)
                    self._starts.setdefault(rid, pcm_duration_s(self._yielded))
                case WordTimingsMsg(request_id=rid, words=words):
                    start = self._starts.setdefault(rid, pcm_duration_s(self._yielded))
                    yield TimedWords(
                        tuple(WordTiming(w.word, start + w.start, start + w.end) for w in words)
                    )
                case CompleteMsg(request_id=rid, audio_bytes=audio, elapsed_s=elapsed):
                    sent = self._pending.pop(rid, None)
                    self._due.pop(rid, None)
                    self._starts.pop(rid, None)
                    first_at = self._first_at.pop(rid, None)
                    first_bytes = self._first_bytes.pop(rid, None)
                    first = None
                    if first_at is not None:  # the server's time less what came after it
                        first = min(elapsed, max(0.0, elapsed - (clock() - first_at)))
                    if sent is not None and self._on_complete is not None:
                        index, chars = sent
                        done = Completed(index, chars, audio, elapsed, first, first_bytes)
                        self._on_complete(done)
                case CancelledMsg(request_id=rid):
                    self._pending.pop(rid, None)
                    self._due.pop(rid, None)
                    self._first_at.pop(rid, None)
                    self._first_bytes.pop(rid, None)
                case ErrorMsg(code=code, message=message):
                    raise model_server_error(code, message, code in RETRYABLE_CODES)
                case _:
                    pass  # synthesis_start, and control types this side does not know

    async def _next(self) -> bytes | str | TTSError | object:
        """The next frame; while chunks are pending, no longer than `tts_timeout_s` past the
        earliest one's due time (every frame that comes restarts the wait)."""
        loop = asyncio.get_running_loop()
        if self._tts_timeout_s is None or not self._due:
            return await self._inbox.get()
        patience = max(0.0, min(self._due.values()) - loop.time()) + self._tts_timeout_s
        try:
            async with asyncio.timeout(patience):
                return await self._inbox.get()
        except TimeoutError:
            raise TTSError(
                f"no audio from the model server for {self._tts_timeout_s:.1f} s past its due time",
                code="tts_timeout",
                retryable=True,
            ) from None

    async def cancel(self) -> None:
        await self._send_frame(protocol.cancel_message())

    async def close(self) -> None:
        await self._send_frame(protocol.close_message())

    # --- for the reader that receives frames ------------------------------------------------

    async def received(self, frame: bytes | str) -> None:
        await self._inbox.put(frame)

    async def failed(self, error: TTSError) -> None:
        await self._inbox.put(error)
