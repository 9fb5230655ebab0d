"""Audio helpers, pure: float samples to s16le PCM, silence trimming, WAV headers."""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from model_server.protocol import CHANNELS, SAMPLE_RATE, SAMPLE_WIDTH

FloatAudio = npt.NDArray[np.float32]

STREAMING_SIZE = 0xFFFFFFFF  # RIFF/data size of a WAV whose length is not known up front


@dataclass(frozen=True)
class TrimPolicy:
    """Every segment is cut to its audible part plus the same margins, so that consecutive
    segments (and consecutive requests) join with the same natural pause."""

    threshold: float = 0.01
    lead_s: float = 0.03
    tail_s: float = 0.12

    def apply(self, audio: FloatAudio) -> FloatAudio:
        loud = np.flatnonzero(np.abs(audio) > self.threshold)
        if loud.size == 0:
            return audio[:0]
        start = max(0, int(loud[0]) - int(self.lead_s * SAMPLE_RATE))
        end = int(loud[-1]) + 1 + int(self.tail_s * SAMPLE_RATE)
        out = audio[start:end]
        if end > audio.size:  # the model stopped right after the speech: pad the pause
            out = np.concatenate([out, np.zeros(end - audio.size, np.float32)])
        return out


def to_pcm16(audio: FloatAudio) -> bytes:
    clipped = np.clip(audio, -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2").tobytes()


def wav_header(data_bytes: int | None = None) -> bytes:
    """A 44-byte PCM WAV header; `None` gives the streaming form with 0xFFFFFFFF sizes."""
    data_size = STREAMING_SIZE if data_bytes is None else data_bytes
    riff_size = STREAMING_SIZE if data_bytes is None else 36 + data_bytes
    byte_rate = SAMPLE_RATE * CHANNELS * SAMPLE_WIDTH
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        CHANNELS,
        SAMPLE_RATE,
        byte_rate,
        CHANNELS * SAMPLE_WIDTH,
        SAMPLE_WIDTH * 8,
        b"data",
        data_size,
    )
