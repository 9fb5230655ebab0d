"""The encoder seam: `push(pcm) -> list[bytes]`, `flush() -> list[bytes]`, whole units only."""

from __future__ import annotations

from typing import Protocol

import av
import numpy as np

from kokoro_contract.audio import SAMPLE_RATE
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


class PcmFrames:
    """PCM bytes cut anywhere -> consecutive s16 mono frames at 24 kHz with running timestamps,
    for PyAV's codecs and resampler."""

    def __init__(self) -> None:
        self._aligner = PcmAligner()
        self._pts = 0

    def next(self, pcm: bytes) -> av.AudioFrame | None:
        data = self._aligner.push(pcm)
        if not data:
            return None
        samples = np.frombuffer(data, dtype="<i2").reshape(1, -1)
        frame = av.AudioFrame.from_ndarray(samples, format="s16", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = self._pts
        self._pts += samples.shape[1]
        return frame
