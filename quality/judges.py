"""The two offline judges and the audio plumbing in front of them.

- `MosJudge`: DistillMOS (a compact speech-quality model distilled from an XLS-R judge; its
  weights ship in the `distillmos` wheel): 16 kHz mono in, a mean opinion score 1-5 out.
- `AsrJudge`: PocketSphinx 5 with the en-us acoustic model, language model and dictionary
  from its wheel: 16 kHz mono in, words out. A weak recogniser, but a fair relative yardstick
  of intelligibility between voices, formats and chunk plans.

Both need 16 kHz: `resample` uses libswresample through PyAV (linear interpolation alone costs
~0.2 MOS and would mislead the judge). `decode` turns any format the services send back into
samples with FFmpeg's decoders, so a judged format is judged as a listener's player hears it.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from kokoro_contract.audio import SAMPLE_RATE
from kokoro_contract.formats import AudioFormat

JUDGE_RATE = 16_000
Samples = npt.NDArray[np.float32]  # mono, -1..1

# the demuxer that reads each gateway/OpenAI format's bytes back
DEMUXERS = {
    "mp3": "mp3",
    "aac": "mp4",
    "opus": "webm",
    "ogg": "ogg",
    "adts": "aac",
    "flac": "flac",
    "wav": "wav",
}
# formats with no header: their demuxer is told the rate
RAW_DEMUXERS = {"ulaw_8000": ("mulaw", 8_000), "alaw_8000": ("alaw", 8_000)}


def pcm16(data: bytes) -> Samples:
    """s16le bytes -> float samples."""
    return (np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0).astype(np.float32)


def _resampler() -> Any:
    return av.AudioResampler(format="flt", layout="mono", rate=JUDGE_RATE)


def _drain(resampler: Any, frame: Any, out: list[Samples]) -> None:
    for resampled in resampler.resample(frame):
        out.append(resampled.to_ndarray().reshape(-1).astype(np.float32))


def resample(samples: Samples, rate: int) -> Samples:
    """Mono float samples at `rate` -> 16 kHz, through libswresample."""
    if rate == JUDGE_RATE:
        return samples.astype(np.float32)
    frame = av.AudioFrame.from_ndarray(
        samples.astype(np.float32).reshape(1, -1), format="flt", layout="mono"
    )
    frame.sample_rate = rate
    resampler = _resampler()
    out: list[Samples] = []
    _drain(resampler, frame, out)
    _drain(resampler, None, out)
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def decode(data: bytes, format_name: str, rate: int = SAMPLE_RATE) -> Samples:
    """A whole response body in `format_name` (a registry name; `pcm` at `rate`) -> 16 kHz
    mono samples."""
    if format_name == "pcm":
        return resample(pcm16(data), rate)
    resampler = _resampler()
    out: list[Samples] = []
    demuxer, options = DEMUXERS.get(format_name), {}
    if format_name in RAW_DEMUXERS:
        demuxer, rate = RAW_DEMUXERS[format_name]
        options = {"sample_rate": str(rate), "ch_layout": "mono"}
    with av.open(io.BytesIO(data), "r", format=demuxer, options=options) as container:
        for frame in container.decode(audio=0):
            frame.pts = None  # let the resampler count samples, not the container's clock
            _drain(resampler, frame, out)
    _drain(resampler, None, out)
    return np.concatenate(out) if out else np.zeros(0, np.float32)


def encode(pcm: bytes, fmt: AudioFormat) -> bytes:
    """A whole reply's PCM through the gateway's encoder for `fmt`, as one response body."""
    from gateway.encoders import create_encoder

    encoder = create_encoder(fmt)
    return b"".join([*encoder.push(pcm), *encoder.flush()])


def round_trip(pcm: bytes, fmt: AudioFormat) -> Samples:
    """What a listener's player hears of `pcm` sent in `fmt`: encoded, decoded, at 16 kHz."""
    return decode(encode(pcm, fmt), fmt.name, fmt.codec_rate)


class MosJudge:
    """DistillMOS on the CPU. Deterministic: the same samples give the same score."""

    def __init__(self) -> None:
        import torch
        from distillmos import ConvTransformerSQAModel

        with contextlib.redirect_stdout(io.StringIO()):  # it prints where the weights came from
            self._model = ConvTransformerSQAModel().eval()
        self._torch = torch

    def score(self, samples: Samples) -> float:
        """Mean opinion score 1-5 of 16 kHz mono samples (any length; long ones are judged in
        overlapping windows and averaged)."""
        if samples.size == 0:
            raise ValueError("no audio to judge")
        with self._torch.inference_mode():
            return float(self._model(self._torch.from_numpy(samples.reshape(1, -1))).item())


class AsrJudge:
    """PocketSphinx with its bundled en-us models; quiet. A fresh decoder for every clip: one
    decoder adapts to what it heard before (its cepstral mean), so the same clip could be heard
    differently after other clips, and the word error rate would depend on the order."""

    def __init__(self) -> None:
        from pocketsphinx import Decoder

        self._decoder = Decoder
        self._decoder(samprate=JUDGE_RATE, loglevel="FATAL")  # fails here if the models are gone

    def transcribe(self, samples: Samples) -> str:
        decoder = self._decoder(samprate=JUDGE_RATE, loglevel="FATAL")
        pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2").tobytes()
        decoder.start_utt()
        decoder.process_raw(pcm, full_utt=True)
        decoder.end_utt()
        hypothesis = decoder.hyp()
        return hypothesis.hypstr if hypothesis is not None else ""
