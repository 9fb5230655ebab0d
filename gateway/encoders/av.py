"""Compressed formats through PyAV (FFmpeg's libmp3lame, aac, libopus, flac and muxers).

One encoder lives for the whole response, so sentences join without the priming gap that
per-sentence encoding leaves (~56 ms per join in MP3). Codec, bitrate and muxer options come
from the format's registry entry.
"""

from __future__ import annotations

import io
from typing import Any, cast

import av

from gateway.encoders.base import EncoderError, PcmFrames
from gateway.encoders.framing import Mp4FragmentSplitter, WebmClusterSplitter
from kokoro_contract.formats import AudioFormat

Splitter = Mp4FragmentSplitter | WebmClusterSplitter
# containers whose output must be cut into units a browser can append
_SPLITTERS: dict[str, type[Splitter]] = {"mp4": Mp4FragmentSplitter, "webm": WebmClusterSplitter}


class _Collect(io.RawIOBase):
    """The muxer's output file: collects what it writes until the encoder hands it on."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        self.data += b
        return len(b)

    def take(self) -> bytes:
        out = bytes(self.data)
        self.data.clear()
        return out


class BareCodecEncoder:
    """A codec without a muxer: libmp3lame, each packet one whole frame, no ID3 or Xing tag;
    G.711 (pcm_mulaw, pcm_alaw), each packet whole samples of a byte each."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._ctx = cast(Any, av.CodecContext.create(str(fmt.codec), "w"))
        self._ctx.sample_rate = fmt.codec_rate  # PyAV resamples the 24 kHz frames to it
        self._ctx.layout = "mono"
        # libmp3lame takes planar samples, the G.711 codecs packed ones
        planar = "s16p" in {f.name for f in self._ctx.codec.audio_formats}
        self._ctx.format = "s16p" if planar else "s16"
        if fmt.bit_rate:
            self._ctx.bit_rate = fmt.bit_rate
        self._ctx.options = dict(fmt.codec_options)
        self._ctx.open()
        self._frames = PcmFrames()

    def _encode(self, frame: av.AudioFrame | None) -> list[bytes]:
        try:
            return [bytes(p) for p in self._ctx.encode(frame)]
        except av.FFmpegError as exc:
            raise EncoderError(f"{self.format.name} encoder failed: {exc}") from exc

    def push(self, pcm: bytes) -> list[bytes]:
        frame = self._frames.next(pcm)
        return self._encode(frame) if frame is not None else []

    def flush(self) -> list[bytes]:
        return self._encode(None)


class MuxedEncoder:
    """An encoder plus a streaming muxer writing into memory, cut into whole units."""

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt
        self._out = _Collect()
        self._container: Any = av.open(
            self._out, "w", format=fmt.container, options=dict(fmt.muxer_options)
        )
        self._stream = cast(
            Any,
            self._container.add_stream(
                str(fmt.codec),
                rate=fmt.codec_rate,
                layout="mono",
                options=dict(fmt.codec_options),
            ),
        )
        if fmt.bit_rate:
            self._stream.bit_rate = fmt.bit_rate
        splitter = _SPLITTERS.get(fmt.container or "")
        self._splitter: Splitter | None = splitter() if splitter is not None else None
        self._frames = PcmFrames()
        self._closed = False

    def _units(self, data: bytes, final: bool = False) -> list[bytes]:
        if self._splitter is None:
            return [data] if data else []
        units = self._splitter.push(data)
        return units + self._splitter.flush() if final else units

    def push(self, pcm: bytes) -> list[bytes]:
        frame = self._frames.next(pcm)
        if frame is None:
            return []
        try:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)
        except av.FFmpegError as exc:
            raise EncoderError(f"{self.format.name} encoder failed: {exc}") from exc
        return self._units(self._out.take())

    def flush(self) -> list[bytes]:
        if self._closed:
            return []
        self._closed = True
        try:
            for packet in self._stream.encode(None):
                self._container.mux(packet)
            self._container.close()
        except av.FFmpegError as exc:
            raise EncoderError(f"{self.format.name} encoder failed: {exc}") from exc
        return self._units(self._out.take(), final=True)
