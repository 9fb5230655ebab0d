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

    def speech(self, audio: FloatAudio) -> tuple[int, int]:
        """The audible part, `audio[first:last]`: from the first sample over the threshold to
        past the last one; (0, 0) when none is."""
        loud = np.flatnonzero(np.abs(audio) > self.threshold)
        if loud.size == 0:
            return 0, 0
        return int(loud[0]), int(loud[-1]) + 1

    def bounds(self, audio: FloatAudio) -> tuple[int, int]:
        """The samples `apply` keeps, `audio[start:end]`: the audible part and its margins;
        `start` is what it cuts at the front, `end` may lie past the audio (the pause it pads)."""
        first, last = self.speech(audio)
        if last == 0:
            return 0, 0
        return max(0, first - int(self.lead_s * SAMPLE_RATE)), last + int(self.tail_s * SAMPLE_RATE)

    def apply(self, audio: FloatAudio) -> FloatAudio:
        start, end = self.bounds(audio)
        out = audio[start:end]
        if end > audio.size:  # the model stopped right after the speech: pad the pause
            out = np.concatenate([out, np.zeros(end - audio.size, np.float32)])
        return out


def to_pcm16(audio: FloatAudio) -> bytes:
    clipped = np.clip(audio, -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2").tobytes()
