"""The one registry of audio formats: what each is called, its MIME type, how it is encoded
and framed, and who may ask for it. The gateway's routes and encoders, the model server's
`POST /invocations` and the docs all read it; nothing else lists formats.

Browser routes (SSE, WebSocket) offer `pcm`, `wav`, `mp3`, `aac` (AAC-LC in fragmented MP4)
and `opus` (Opus in WebM): each plays through Media Source Extensions or the PCM worklet.
OpenAI's `/v1/audio/speech` names differ: its `opus` is Ogg and its `aac` is ADTS.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kokoro_contract.audio import SAMPLE_RATE

PCM_MIME = f"audio/pcm;rate={SAMPLE_RATE};channels=1;encoding=s16le"


@dataclass(frozen=True)
class AudioFormat:
    name: str
    mime: str
    codec: str | None = None  # FFmpeg encoder; None: PCM as it comes from the model
    container: str | None = None  # FFmpeg muxer; None: bare codec packets (or raw PCM)
    bit_rate: int | None = None  # bits per second; None: lossless or raw
    codec_rate: int = SAMPLE_RATE  # the codec's sample rate (Opus runs at 48 kHz)
    codec_options: Mapping[str, str] = field(default_factory=dict)  # FFmpeg encoder options
    muxer_options: Mapping[str, str] = field(default_factory=dict)
    units: str = "samples"  # what one audio event carries whole
    browser: bool = False  # offered on the browser routes (SSE, WebSocket)
    openai: str | None = None  # the `response_format` OpenAI's speech API calls it
    model_server: bool = False  # `POST /invocations` of the model server can answer it


# Bitrates and encoder settings chosen by `make bench-quality` (docs/measured.md, "Speech
# quality (`make bench-quality`)", has the figures): for each codec the lowest bitrate whose
# decoded audio is within 0.10 MOS of the PCM of the same replies and whose next step down is no
# cliff, so the guard's 0.15 holds with room on other texts. At speech bitrates FFmpeg's own AAC
# encoder scores higher with its "fast" coder than with the default "twoloop"; Opus is set for
# speech.
AAC_OPTIONS: Mapping[str, str] = MappingProxyType({"aac_coder": "fast"})
OPUS_OPTIONS: Mapping[str, str] = MappingProxyType({"application": "voip"})

_FORMATS = (
    AudioFormat("pcm", PCM_MIME, browser=True, openai="pcm", model_server=True),
    AudioFormat("wav", "audio/wav", browser=True, openai="wav", model_server=True),
    AudioFormat(
        "mp3",
        "audio/mpeg",
        codec="libmp3lame",
        bit_rate=40_000,
        units="MP3 frames",
        browser=True,
        openai="mp3",
    ),
    AudioFormat(
        "aac",
        'audio/mp4; codecs="mp4a.40.2"',
        codec="aac",
        container="mp4",
        bit_rate=48_000,
        codec_options=AAC_OPTIONS,
        # for MSE: an empty moov, then moof+mdat every 100 ms of audio
        muxer_options={
            "movflags": "empty_moov+default_base_moof+skip_trailer",
            "frag_duration": "100000",
        },
        units="fMP4 fragments",
        browser=True,
    ),
    AudioFormat(
        "opus",
        'audio/webm; codecs="opus"',
        codec="libopus",
        container="webm",
        bit_rate=32_000,
        codec_options=OPUS_OPTIONS,
        codec_rate=48_000,
        muxer_options={"live": "1", "cluster_time_limit": "100"},
        units="WebM clusters",
        browser=True,
    ),
    AudioFormat(
        "ogg",
        "audio/ogg; codecs=opus",
        codec="libopus",
        container="ogg",
        bit_rate=32_000,
        codec_options=OPUS_OPTIONS,
        codec_rate=48_000,
        muxer_options={"page_duration": "100000"},
        units="Ogg pages",
        openai="opus",
    ),
    AudioFormat(
        "adts",
        "audio/aac",
        codec="aac",
        container="adts",
        bit_rate=48_000,
        codec_options=AAC_OPTIONS,
        units="ADTS frames",
        openai="aac",
    ),
    AudioFormat(
        "flac", "audio/flac", codec="flac", container="flac", units="FLAC frames", openai="flac"
    ),
)

FORMATS: Mapping[str, AudioFormat] = MappingProxyType({f.name: f for f in _FORMATS})
BROWSER_FORMATS = tuple(f.name for f in _FORMATS if f.browser)
MODEL_SERVER_FORMATS = tuple(f.name for f in _FORMATS if f.model_server)
OPENAI_FORMATS: Mapping[str, AudioFormat] = MappingProxyType(
    {f.openai: f for f in _FORMATS if f.openai is not None}
)


class UnknownFormat(ValueError):
    pass


def lookup(name: object, offered: tuple[str, ...] | None = None) -> AudioFormat:
    """The format called `name`, if it is among `offered` (default: all)."""
    names = offered if offered is not None else tuple(FORMATS)
    if not isinstance(name, str) or name not in names:
        raise UnknownFormat(f"format {name!r} is not supported; use one of {', '.join(names)}")
    return FORMATS[name]
