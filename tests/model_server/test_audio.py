from __future__ import annotations

import io
import struct
import wave

import numpy as np

from kokoro_contract.audio import wav_header
from model_server.audio import TrimPolicy, to_pcm16


def test_streaming_wav_header_has_unknown_sizes() -> None:
    header = wav_header(None)
    assert len(header) == 44
    assert header[:4] == b"RIFF"
    assert header[8:16] == b"WAVEfmt "
    assert struct.unpack_from("<I", header, 4)[0] == 0xFFFFFFFF
    assert header[36:40] == b"data"
    assert struct.unpack_from("<I", header, 40)[0] == 0xFFFFFFFF


def test_sized_wav_is_read_by_the_stdlib() -> None:
    pcm = to_pcm16(np.linspace(-1, 1, 2400, dtype=np.float32))
    with wave.open(io.BytesIO(wav_header(len(pcm)) + pcm)) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24_000)
        assert w.getnframes() == 2400
        assert w.readframes(2400) == pcm


def test_pcm16_clips_and_rounds() -> None:
    pcm = to_pcm16(np.array([0.0, 1.0, -1.0, 2.0, -3.0, 0.5], dtype=np.float32))
    assert np.frombuffer(pcm, "<i2").tolist() == [0, 32767, -32767, 32767, -32767, 16384]


def test_trim_keeps_speech_with_fixed_margins() -> None:
    policy = TrimPolicy(threshold=0.01, lead_s=0.01, tail_s=0.02)
    audio = np.zeros(24_000, np.float32)
    audio[6_000:12_000] = 0.3
    out = policy.apply(audio)
    assert out.size == 240 + 6_000 + 480
    assert np.all(out[240:6240] == np.float32(0.3))
    assert not np.any(out[:240])
    assert not np.any(out[6240:])


def test_trim_pads_the_pause_when_speech_runs_to_the_end() -> None:
    policy = TrimPolicy(threshold=0.01, lead_s=0.0, tail_s=0.01)
    audio = np.full(100, 0.5, np.float32)
    out = policy.apply(audio)
    assert out.size == 100 + 240
    assert not np.any(out[100:])


def test_trim_of_silence_is_empty() -> None:
    assert TrimPolicy().apply(np.zeros(1000, np.float32)).size == 0
