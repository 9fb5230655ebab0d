from __future__ import annotations

import io

import av
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.encoders import create_encoder
from gateway.encoders.framing import Mp4FragmentSplitter, WebmClusterSplitter
from kokoro_contract import formats
from kokoro_contract.formats import FORMATS
from tests.support.codec_checks import mp3_frame_length, mp4_boxes, split_mp3_frames

SR = 24_000


def tone(seconds: float, freq: float = 440.0) -> bytes:
    t = np.arange(int(seconds * SR)) / SR
    return (np.sin(2 * np.pi * freq * t) * 8000).astype("<i2").tobytes()


def encode(fmt: str, pcm: bytes, piece: int) -> list[bytes]:
    encoder = create_encoder(FORMATS[fmt])
    units: list[bytes] = []
    for i in range(0, len(pcm), piece):
        units += encoder.push(pcm[i : i + piece])
    return units + encoder.flush()


def decoded_seconds(fmt: str, data: bytes) -> float:
    options = {"sample_rate": "24000", "ch_layout": "mono"} if fmt == "pcm" else {}
    with av.open(
        io.BytesIO(data), "r", format="s16le" if fmt == "pcm" else None, options=options
    ) as c:
        return float(sum(f.samples / f.sample_rate for f in c.decode(audio=0)))


def test_mp3_header_lengths() -> None:
    # MPEG-2 layer III, 48 kbit/s, 24 kHz: 72 * 48000 / 24000 = 144 bytes
    assert mp3_frame_length(bytes([0xFF, 0xF3, 0x64, 0xC4])) == 144
    # MPEG-1 layer III, 128 kbit/s, 44.1 kHz, padded: 417 + 1
    assert mp3_frame_length(bytes([0xFF, 0xFB, 0x92, 0x00])) == 418
    assert mp3_frame_length(b"ID3\x04") is None
    with pytest.raises(ValueError, match="no whole MP3 frame"):
        split_mp3_frames(bytes([0xFF, 0xF3, 0x64, 0xC4]) + b"\x00" * 100)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_format_decodes_to_the_input_duration(fmt: str) -> None:
    data = b"".join(encode(fmt, tone(2.0), piece=7_777))  # odd-sized pieces cut samples
    assert decoded_seconds(fmt, data) == pytest.approx(2.0, abs=0.1)


def test_mp3_units_are_whole_frames_with_no_tag() -> None:
    units = encode("mp3", tone(1.5), piece=4_801)
    assert units[0][:3] != b"ID3"
    for unit in units:
        frames = split_mp3_frames(unit)
        # MPEG-2 layer III at 24 kHz: 24 ms frames of 72 * bitrate / 24000 bytes (40 kbit/s: 120)
        assert all(len(f) == 72 * (FORMATS["mp3"].bit_rate or 0) // 24_000 for f in frames)


def test_aac_units_are_init_then_fragments() -> None:
    units = encode("aac", tone(1.5), piece=9_600)
    assert mp4_boxes(units[0]) == [b"ftyp", b"moov"]
    assert len(units) > 5
    for unit in units[1:]:
        assert mp4_boxes(unit) == [b"moof", b"mdat"]


def test_opus_units_are_header_then_clusters() -> None:
    units = encode("opus", tone(1.5), piece=9_600)
    assert units[0][:4] == bytes.fromhex("1a45dfa3")
    assert bytes.fromhex("1f43b675") not in units[0]
    assert len(units) > 5
    for unit in units[1:]:
        assert unit[:4] == bytes.fromhex("1f43b675")


def test_one_encoder_is_gapless_across_sentences() -> None:
    # two "sentences" through one encoder decode to their summed length, with no gap
    encoder = create_encoder(FORMATS["mp3"])
    units = encoder.push(tone(1.0)) + encoder.push(tone(1.0, 330.0)) + encoder.flush()
    joined = decoded_seconds("mp3", b"".join(units))
    separate = sum(
        decoded_seconds("mp3", b"".join(encode("mp3", tone(1.0), 48_000))) for _ in range(2)
    )
    assert joined < separate - 0.04  # per-sentence encoders add a priming gap at each join


def test_unknown_format() -> None:
    with pytest.raises(formats.UnknownFormat, match="'aiff' is not supported"):
        formats.lookup("aiff")
    with pytest.raises(formats.UnknownFormat, match="use one of pcm, wav, mp3, aac, opus"):
        formats.lookup("ogg", formats.BROWSER_FORMATS)


@pytest.fixture(scope="module")
def fmp4_stream() -> bytes:
    return b"".join(encode("aac", tone(1.0), piece=4_800))


@pytest.fixture(scope="module")
def webm_stream() -> bytes:
    return b"".join(encode("opus", tone(1.0), piece=4_800))


def _resplit(
    splitter: Mp4FragmentSplitter | WebmClusterSplitter, data: bytes, cuts: list[int]
) -> list[bytes]:
    points = sorted(set(cuts))
    out: list[bytes] = []
    for a, b in zip([0, *points], [*points, len(data)], strict=True):
        out += splitter.push(data[a:b])
    return out + splitter.flush()


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 20_000), max_size=30))
def test_mp4_splitter_ignores_how_bytes_arrive(fmp4_stream: bytes, cuts: list[int]) -> None:
    cuts = [c for c in cuts if c <= len(fmp4_stream)]
    whole = _resplit(Mp4FragmentSplitter(), fmp4_stream, [])
    assert _resplit(Mp4FragmentSplitter(), fmp4_stream, cuts) == whole
    assert b"".join(whole) == fmp4_stream


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 20_000), max_size=30))
def test_webm_splitter_ignores_how_bytes_arrive(webm_stream: bytes, cuts: list[int]) -> None:
    cuts = [c for c in cuts if c <= len(webm_stream)]
    whole = _resplit(WebmClusterSplitter(), webm_stream, [])
    assert _resplit(WebmClusterSplitter(), webm_stream, cuts) == whole
    assert b"".join(whole) == webm_stream


def test_mp4_splitter_drops_mfra_and_rejects_a_cut_tail() -> None:
    box = (16).to_bytes(4, "big") + b"mfra" + b"\x00" * 8
    moov = (8).to_bytes(4, "big") + b"moov"
    splitter = Mp4FragmentSplitter()
    assert splitter.push(box + moov) == [moov]
    splitter.push(b"\x00\x00\x00\x20moof")
    with pytest.raises(ValueError, match="unfinished"):
        splitter.flush()
