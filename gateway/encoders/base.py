"""The encoder seam: `push(pcm) -> list[bytes]`, `flush() -> list[bytes]`, whole units only."""

from __future__ import annotations

from typing import Protocol

from kokoro_contract.formats import AudioFormat


class EncoderError(RuntimeError):
    pass


class Encoder(Protocol):
    format: AudioFormat

    def push(self, pcm: bytes) -> list[bytes]:
        """Encode more PCM (s16le 24 kHz mono, any length, even an odd number of bytes)."""
        ...

    def flush(self) -> list[bytes]:
        """Drain the codec and the container at the end of the response."""
        ...


class PcmAligner:
    """Keeps a trailing odd byte until its pair arrives (HTTP chunks cut samples in half)."""

    def __init__(self) -> None:
        self._odd = b""

    def push(self, pcm: bytes) -> bytes:
        data = self._odd + pcm
        cut = len(data) - len(data) % 2
        self._odd = data[cut:]
        return data[:cut]
