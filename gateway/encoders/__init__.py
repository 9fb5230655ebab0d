"""One continuous encoder per response: s16le 24 kHz mono PCM in, whole codec units out.

What to build for a format is read from its entry in `kokoro_contract.formats`: PCM and WAV
pass the samples through (resampled, at a rate the client asked for); a codec without a
container (MP3, G.711) yields its packets, which are whole frames or samples; a codec in a
container goes through PyAV's muxer, cut into whole units (fMP4 fragments, WebM clusters) by
`gateway.encoders.framing`."""

from __future__ import annotations

from gateway.encoders.av import BareCodecEncoder, MuxedEncoder
from gateway.encoders.base import Encoder, EncoderError
from gateway.encoders.pcm import PcmEncoder, WavEncoder
from kokoro_contract.formats import AudioFormat


def create_encoder(fmt: AudioFormat) -> Encoder:
    if fmt.codec is None:
        return WavEncoder(fmt) if fmt.name == "wav" else PcmEncoder(fmt)
    return BareCodecEncoder(fmt) if fmt.container is None else MuxedEncoder(fmt)


__all__ = ["Encoder", "EncoderError", "create_encoder"]
