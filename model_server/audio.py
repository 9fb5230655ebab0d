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


class StreamTrim:
    """`TrimPolicy.apply` on audio that arrives in pieces (progressive synthesis): `push` each
    piece and get what is certain to be kept, `flush` at the end for the rest; all the pieces
    out, joined, are `apply` of all the pieces in. A quiet run is held back only past the
    policy's tail pause (which stays in any case) until the next loud sample or the end."""

    def __init__(self, policy: TrimPolicy) -> None:
        self.policy = policy
        self._lead = int(policy.lead_s * SAMPLE_RATE)
        self._tail = int(policy.tail_s * SAMPLE_RATE)
        self._pending: FloatAudio = np.zeros(0, np.float32)
        self._pos = 0  # samples pushed
        self._emitted = 0  # where `_pending` starts
        self._first: int | None = None  # the first loud sample
        self._last = 0  # the last loud sample

    @property
    def cut(self) -> int:
        """The samples cut at the front: `TrimPolicy.bounds`' start (0 until a loud one comes,
        as for silence)."""
        return 0 if self._first is None else max(0, self._first - self._lead)

    def push(self, audio: FloatAudio) -> FloatAudio:
        self._pending = np.concatenate([self._pending, audio.astype(np.float32, copy=False)])
        loud = np.flatnonzero(np.abs(audio) > self.policy.threshold)
        if loud.size:
            self._last = self._pos + int(loud[-1])
            if self._first is None:
                self._first = self._pos + int(loud[0])
        self._pos += audio.size
        if self._first is None:  # all quiet so far: only the lead before the speech may stay
            keep = min(self._lead, self._pending.size)
            self._pending = self._pending[self._pending.size - keep :]
            self._emitted = self._pos - keep
            return np.zeros(0, np.float32)
        start = max(0, self._first - self._lead)
        if start > self._emitted:
            self._pending = self._pending[start - self._emitted :]
            self._emitted = start
        return self._take(min(self._pos, self._last + 1 + self._tail))

    def flush(self) -> FloatAudio:
        if self._first is None:
            return np.zeros(0, np.float32)
        end = self._last + 1 + self._tail
        out = self._take(min(self._pos, end))
        self._pending = np.zeros(0, np.float32)
        if end > self._pos:  # the audio stopped right after the speech: pad the pause
            out = np.concatenate([out, np.zeros(end - self._pos, np.float32)])
        return out

    def _take(self, until: int) -> FloatAudio:
        n = max(0, until - self._emitted)
        out, self._pending = self._pending[:n], self._pending[n:]
        self._emitted += n
        return out


def to_pcm16(audio: FloatAudio) -> bytes:
    clipped = np.clip(audio, -1.0, 1.0)
    return (clipped * 32767.0).round().astype("<i2").tobytes()
