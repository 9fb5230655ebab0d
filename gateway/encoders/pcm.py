"""Uncompressed formats: raw PCM, and WAV with the streaming header."""

from __future__ import annotations

from gateway.encoders.base import PcmAligner
from kokoro_contract.audio import wav_header
from kokoro_contract.formats import FORMATS, AudioFormat


class PcmEncoder:
    def __init__(self, fmt: AudioFormat = FORMATS["pcm"]) -> None:
        self.format = fmt
        self._aligner = PcmAligner()

    def push(self, pcm: bytes) -> list[bytes]:
        data = self._aligner.push(pcm)
        return [data] if data else []

    def flush(self) -> list[bytes]:
        return []


class WavEncoder(PcmEncoder):
    """A streaming WAV: the 44-byte header (sizes 0xFFFFFFFF) with the first audio."""

    def __init__(self, fmt: AudioFormat = FORMATS["wav"]) -> None:
        super().__init__(fmt)
        self._header: bytes | None = wav_header(None)

    def push(self, pcm: bytes) -> list[bytes]:
        units = super().push(pcm)
        if units and self._header is not None:
            units[0] = self._header + units[0]
            self._header = None
        return units

    def flush(self) -> list[bytes]:
        header, self._header = self._header, None
        return [header] if header is not None else []
