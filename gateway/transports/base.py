"""The TTS seams: a bidi transport opens one stream per reply; a batch transport synthesizes a
whole text in one call."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Protocol

# told when the model server has finished a chunk: (index, characters, PCM bytes, seconds)
OnComplete = Callable[[int, int, int, float], None]


class TTSStream(Protocol):
    """One reply's synthesis stream (bidi mode): chunks in, their audio out, in order."""

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        """Synthesize this chunk after the ones already sent; its first audio is needed
        `deadline_ms` from now (None: as soon as possible)."""
        ...

    async def end_input(self) -> None:
        """No more chunks: `audio()` ends once the last one is synthesized."""
        ...

    def audio(self) -> AsyncIterator[bytes]:
        """PCM (s16le, 24 kHz, mono) of every chunk, in order."""
        ...


class BidiTransport(Protocol):
    def open(
        self, voice: str | None, speed: float, on_complete: OnComplete | None = None
    ) -> AbstractAsyncContextManager[TTSStream]:
        """Open a stream; leaving the context early (cancel, disconnect) aborts its work."""
        ...


class BatchTransport(Protocol):
    def synthesize(self, text: str, voice: str | None, speed: float) -> AsyncGenerator[bytes]:
        """PCM of the whole text, streamed; closing the generator aborts the request."""
        ...
