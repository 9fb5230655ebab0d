"""Audio helpers, pure: silence trimming and float samples to s16le PCM."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kokoro_contract.audio import SAMPLE_RATE
from model_server.engines.base import FloatAudio


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
