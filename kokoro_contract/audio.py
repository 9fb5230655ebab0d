"""The audio both services exchange, pure: s16le 24 kHz mono PCM and the streaming WAV header."""

from __future__ import annotations

import struct

SAMPLE_RATE = 24_000
SAMPLE_WIDTH = 2  # bytes, s16le
CHANNELS = 1
BYTES_PER_SECOND = SAMPLE_RATE * SAMPLE_WIDTH * CHANNELS

STREAMING_SIZE = 0xFFFFFFFF  # RIFF/data size of a WAV whose length is not known up front


def pcm_duration_s(n_bytes: int) -> float:
    return n_bytes / BYTES_PER_SECOND


def wav_header(data_bytes: int | None = None, rate: int = SAMPLE_RATE) -> bytes:
    """A 44-byte PCM WAV header (s16le mono at `rate` Hz); `None` gives the streaming form with
    0xFFFFFFFF sizes."""
    data_size = STREAMING_SIZE if data_bytes is None else data_bytes
    riff_size = STREAMING_SIZE if data_bytes is None else 36 + data_bytes
    return struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        riff_size,
        b"WAVE",
        b"fmt ",
        16,
        1,  # PCM
        CHANNELS,
        rate,
        rate * SAMPLE_WIDTH * CHANNELS,
        CHANNELS * SAMPLE_WIDTH,
        SAMPLE_WIDTH * 8,
        b"data",
        data_size,
    )
