"""The one registry of audio formats: what each is called, its MIME type, how it is encoded
and framed, and who may ask for it. The gateway's routes and encoders, the model server's
`POST /invocations` and the docs all read it; nothing else lists formats.

Browser routes (SSE, WebSocket) offer `pcm`, `wav`, `mp3`, `aac` (AAC-LC in fragmented MP4)
and `opus` (Opus in WebM): each plays through Media Source Extensions or the PCM worklet. They
and OpenAI's `/v1/audio/speech` also offer the telephone's G.711 at 8 kHz (`ulaw_8000`,
`alaw_8000`), for agents that relay the audio to a call; and `pcm` and `wav` at the sample rates
speech pipelines and phones run at (`PCM_RATES`, asked for as `sample_rate`: `AudioFormat.at`).
OpenAI's names differ: its `opus` is Ogg and its `aac` is ADTS.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kokoro_contract.audio import SAMPLE_RATE

# the rates `pcm` and `wav` may be asked for: the telephone's, speech recognisers' and
# pipelines', the model's own, and the two of audio interfaces
PCM_RATES = (8_000, 16_000, 22_050, SAMPLE_RATE, 44_100, 48_000)


def pcm_mime(rate: int) -> str:
    """Raw s16le mono PCM at `rate` Hz."""
    return f"audio/pcm;rate={rate};channels=1;encoding=s16le"


PCM_MIME = pcm_mime(SAMPLE_RATE)


@dataclass(frozen=True)
class AudioFormat:
    name: str
    mime: str
    codec: str | None = None  # FFmpeg encoder; None: PCM as it comes from the model
    container: str | None = None  # FFmpeg muxer; None: bare codec packets (or raw PCM)
    bit_rate: int | None = None  # bits per second; None: lossless or raw
    # the sample rate of the audio it carries: the codec's (Opus runs at 48 kHz), or what the
    # client asked for (`at`); the model's 24 kHz is resampled to it by FFmpeg's libswresample
    codec_rate: int = SAMPLE_RATE
    rates: tuple[int, ...] = ()  # the rates a client may ask for (`at`); none: codec_rate only
    codec_options: Mapping[str, str] = field(default_factory=dict)  # FFmpeg encoder options
    muxer_options: Mapping[str, str] = field(default_factory=dict)
    units: str = "samples"  # what one audio event carries whole
    browser: bool = False  # offered on the browser routes (SSE, WebSocket)
    openai: str | None = None  # the `response_format` OpenAI's speech API calls it
    model_server: bool = False  # `POST /invocations` of the model server can answer it

    def at(self, rate: int | None) -> AudioFormat:
        """This format at `rate` Hz, one of `rates` (None, or its own rate: itself)."""
        if rate is None or rate == self.codec_rate:
            return self
        if rate not in self.rates:
            offered = ", ".join(map(str, self.rates or (self.codec_rate,)))
            raise UnknownFormat(f"sample_rate {rate} is not offered for {self.name}; use {offered}")
        mime = pcm_mime(rate) if self.mime == pcm_mime(self.codec_rate) else self.mime
        return dataclasses.replace(self, codec_rate=rate, mime=mime)


# Bitrates and encoder settings chosen by `make bench-quality` (docs/measured.md, "2026-12-07
# (morning): each format's spread by reply" has the figures): for each codec the lowest bitrate
# at which every reply of the corpus, decoded, is within 0.10 MOS of its own PCM with a margin
# (its worst reply within 0.06: MP3 40, AAC 64, Opus 48 kbit/s; AAC 48 and Opus 32 were within on
# average but a reply fell to -0.12 and -0.09), so the guard's 0.10 holds on other texts. At
# speech bitrates FFmpeg's own AAC encoder scores higher with its "fast" coder than with the
# default "twoloop"; Opus is set for speech.
AAC_OPTIONS: Mapping[str, str] = MappingProxyType({"aac_coder": "fast"})
OPUS_OPTIONS: Mapping[str, str] = MappingProxyType({"application": "voip"})

_FORMATS = (
    AudioFormat("pcm", PCM_MIME, rates=PCM_RATES, browser=True, openai="pcm", model_server=True),
    AudioFormat("wav", "audio/wav", rates=PCM_RATES, browser=True, openai="wav", model_server=True),
    # G.711 at 8 kHz, a byte a sample, no header: what a telephone call carries
    AudioFormat(
        "ulaw_8000",
        "audio/basic",
        codec="pcm_mulaw",
        codec_rate=8_000,
        browser=True,
        openai="ulaw_8000",
    ),
    AudioFormat(
        "alaw_8000",
        "audio/x-alaw-basic",
        codec="pcm_alaw",
        codec_rate=8_000,
        browser=True,
        openai="alaw_8000",
    ),
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
        bit_rate=64_000,
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
        bit_rate=48_000,
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
        bit_rate=48_000,
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
        bit_rate=64_000,
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
