"""The encoder seam: `push(pcm) -> list[bytes]`, `flush() -> list[bytes]`, whole units only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from model_server.audio import wav_header


class EncoderError(RuntimeError):
    pass


class Encoder(Protocol):
    format: str
    mime: str

    def push(self, pcm: bytes) -> list[bytes]:
        """Encode more PCM (any length, even an odd number of bytes)."""
        ...

    def flush(self) -> list[bytes]:
        """Drain the codec and the container at the end of the response."""
        ...


@dataclass(frozen=True)
class FormatInfo:
    mime: str
    description: str


FORMATS: dict[str, FormatInfo] = {
    "pcm": FormatInfo("audio/pcm;rate=24000;channels=1;encoding=s16le", "raw PCM"),
    "wav": FormatInfo("audio/wav", "WAV, streaming header"),
    "mp3": FormatInfo("audio/mpeg", "MP3 48 kbit/s, whole frames"),
    "aac": FormatInfo('audio/mp4; codecs="mp4a.40.2"', "AAC-LC 32 kbit/s in fragmented MP4"),
    "opus": FormatInfo('audio/webm; codecs="opus"', "Opus 32 kbit/s in WebM"),
    "ogg": FormatInfo("audio/ogg; codecs=opus", "Opus in Ogg (OpenAI's opus)"),
    "adts": FormatInfo("audio/aac", "AAC-LC in ADTS (OpenAI's aac)"),
    "flac": FormatInfo("audio/flac", "FLAC"),
}


class PcmAligner:
    """Keeps a trailing odd byte until its pair arrives (HTTP chunks cut samples in half)."""

    def __init__(self) -> None:
        self._odd = b""

    def push(self, pcm: bytes) -> bytes:
        data = self._odd + pcm
        cut = len(data) - len(data) % 2
        self._odd = data[cut:]
        return data[:cut]


class PcmEncoder:
    format = "pcm"
    mime = FORMATS["pcm"].mime

    def __init__(self) -> None:
        self._aligner = PcmAligner()

    def push(self, pcm: bytes) -> list[bytes]:
        data = self._aligner.push(pcm)
        return [data] if data else []

    def flush(self) -> list[bytes]:
        return []


class WavEncoder(PcmEncoder):
    """A streaming WAV: the 44-byte header (sizes 0xFFFFFFFF) with the first audio."""

    format = "wav"
    mime = FORMATS["wav"].mime

    def __init__(self) -> None:
        super().__init__()
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


def create_encoder(fmt: str) -> Encoder:
    if fmt == "pcm":
        return PcmEncoder()
    if fmt == "wav":
        return WavEncoder()
    if fmt in FORMATS:
        from gateway.encoders.av_encoders import create_av_encoder

        return create_av_encoder(fmt)
    raise EncoderError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
