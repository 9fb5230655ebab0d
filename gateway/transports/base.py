from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Protocol


class TTSSession(Protocol):
    """One long-lived synthesis session for one reply (bidi mode)."""

    async def send(self, text: str) -> None:
        """Synthesize this chunk after the ones already sent."""
        ...

    async def end_input(self) -> None:
        """No more chunks: `audio()` ends once the last one is synthesized."""
        ...

    def audio(self) -> AsyncIterator[bytes]:
        """PCM (s16le, 24 kHz, mono) of every chunk, in order."""
        ...


class BidiTransport(Protocol):
    def session(self, voice: str | None, speed: float) -> AbstractAsyncContextManager[TTSSession]:
        """Open a session; leaving the context early (cancel, disconnect) aborts its work."""
        ...


class BatchTransport(Protocol):
    def synthesize(self, text: str, voice: str | None, speed: float) -> AsyncIterator[bytes]:
        """PCM of the whole text, streamed; closing the iterator aborts the request."""
        ...
