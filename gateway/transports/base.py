"""The TTS seams: a bidi transport opens one stream per reply (a session transport, the
model-server sessions it runs on); a batch transport synthesizes a whole text in one call."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from kokoro_contract.protocol import TextOptions, WordTiming

if TYPE_CHECKING:
    from gateway.transports.framed_stream import FrameCarrier


@dataclass(frozen=True)
class Completed:
    """The model server has finished chunk `index` of a stream."""

    index: int
    chars: int
    audio_bytes: int  # PCM it gave
    elapsed_s: float  # from the start of its synthesis (the queue for a worker included)
    # from the same start to its first audio: the whole synthesis for an engine whose unit of
    # output is the chunk, a fraction of it for a progressive one (None: not measured)
    first_audio_s: float | None = None
    first_audio_bytes: int | None = None  # PCM in its first audio frame


OnComplete = Callable[[Completed], None]  # told when the model server has finished a chunk


@dataclass(frozen=True)
class TimedWords:
    """Word timings for the audio that follows, in seconds from the stream's first sample."""

    words: tuple[WordTiming, ...]


Piece = bytes | TimedWords  # what a stream yields: PCM, and (when asked) word timings


class TTSStream(Protocol):
    """One reply's synthesis stream (bidi mode): chunks in, their audio out, in order."""

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        """Synthesize this chunk after the ones already sent; its first audio is needed
        `deadline_ms` from now (None: as soon as possible)."""
        ...

    async def end_input(self) -> None:
        """No more chunks: `audio()` ends once the last one is synthesized."""
        ...

    def audio(self) -> AsyncIterator[Piece]:
        """PCM (s16le, 24 kHz, mono) of every chunk, in order; with timestamps, each
        segment's word timings before its audio."""
        ...


class BidiTransport(Protocol):
    def open(
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AbstractAsyncContextManager[TTSStream]:
        """Open a stream (`options`: how its text is read; None: the model server's way);
        leaving the context early (cancel, disconnect) aborts its work."""
        ...


class SessionTransport(BidiTransport, Protocol):
    """A bidi transport whose sessions carry model-server frames: a reply's stream may open
    them itself, again after a failure (`framed_stream.FramedTTSStream`)."""

    def connect(self) -> AbstractAsyncContextManager[FrameCarrier]:
        """One session; leaving it completed closes it, leaving it otherwise cancels its work
        at the model server."""
        ...


class BatchTransport(Protocol):
    def synthesize(
        self,
        text: str,
        voice: str | None,
        speed: float,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncGenerator[Piece]:
        """PCM of the whole text, streamed (with timestamps: its word timings first, then the
        audio); closing the generator aborts the request."""
        ...
