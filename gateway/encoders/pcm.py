"""Uncompressed formats: raw PCM, and WAV with the streaming header, at the model's 24 kHz as
it comes or at another rate a client asked for, resampled by FFmpeg's libswresample (through
PyAV) as the audio streams, its filter's state kept from one piece to the next."""

from __future__ import annotations

from typing import Any

import av

from gateway.encoders.base import PcmAligner, PcmFrames
from kokoro_contract.audio import SAMPLE_RATE, wav_header
from kokoro_contract.formats import FORMATS, AudioFormat


class _Resampled:
    """s16le mono at 24 kHz, cut anywhere -> s16le mono at `rate`, with no gap or repeat
    between pieces: one resampler for the whole response, drained at its end."""

    def __init__(self, rate: int) -> None:
        self._frames = PcmFrames()
        self._resampler: Any = av.AudioResampler(format="s16", layout="mono", rate=rate)

    def push(self, pcm: bytes) -> bytes:
        frame = self._frames.next(pcm)
        return self._take(frame) if frame is not None else b""

    def flush(self) -> bytes:
        return self._take(None)

    def _take(self, frame: av.AudioFrame | None) -> bytes:
        return b"".join(
            f.to_ndarray().astype("<i2").tobytes() for f in self._resampler.resample(frame)
        )


class PcmEncoder:
    def __init__(self, fmt: AudioFormat = FORMATS["pcm"]) -> None:
        self.format = fmt
        self._aligner = PcmAligner()
        self._resampled = _Resampled(fmt.codec_rate) if fmt.codec_rate != SAMPLE_RATE else None

    def push(self, pcm: bytes) -> list[bytes]:
        resampled = self._resampled
        data = self._aligner.push(pcm) if resampled is None else resampled.push(pcm)
        return [data] if data else []

    def flush(self) -> list[bytes]:
        rest = self._resampled.flush() if self._resampled is not None else b""
        return [rest] if rest else []


class WavEncoder(PcmEncoder):
    """A streaming WAV: the 44-byte header (sizes 0xFFFFFFFF) with the first audio."""

    def __init__(self, fmt: AudioFormat = FORMATS["wav"]) -> None:
        super().__init__(fmt)
        self._header: bytes | None = wav_header(None, fmt.codec_rate)

    def push(self, pcm: bytes) -> list[bytes]:
        return self._headed(super().push(pcm))

    def flush(self) -> list[bytes]:
        units = self._headed(super().flush())
        header, self._header = self._header, None
        return units or ([header] if header is not None else [])

    def _headed(self, units: list[bytes]) -> list[bytes]:
        if units and self._header is not None:
            units[0] = self._header + units[0]
            self._header = None
        return units
