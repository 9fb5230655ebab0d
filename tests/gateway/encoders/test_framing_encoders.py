from __future__ import annotations

import io
import warnings

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


def encode(fmt: str, pcm: bytes, piece: int, rate: int | None = None) -> list[bytes]:
    encoder = create_encoder(FORMATS[fmt].at(rate))
    units: list[bytes] = []
    for i in range(0, len(pcm), piece):
        units += encoder.push(pcm[i : i + piece])
    return units + encoder.flush()


# the demuxers of the formats with no header: raw samples, at the format's rate
RAW = {"pcm": "s16le", "ulaw_8000": "mulaw", "alaw_8000": "alaw"}


def decoded_seconds(fmt: str, data: bytes, rate: int | None = None) -> float:
    raw = RAW.get(fmt)
    rate = rate or FORMATS[fmt].codec_rate
    options = {"sample_rate": str(rate), "ch_layout": "mono"} if raw else {}
    with av.open(io.BytesIO(data), "r", format=raw, options=options) as c:
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
    with pytest.raises(formats.UnknownFormat, match="use one of pcm, wav, ulaw_8000, alaw_8000"):
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


def peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples.astype(np.float64) * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[int(np.argmax(spectrum))])


@pytest.mark.parametrize("rate", formats.PCM_RATES)
def test_pcm_at_each_rate_keeps_the_duration_and_the_pitch(rate: int) -> None:
    """Two seconds of 440 Hz cut into odd pieces: resampled as they stream, with no gap or
    repeat at a cut, to two seconds at `rate` (within the filter's few samples) at 440 Hz."""
    pcm = tone(2.0)
    out = np.frombuffer(b"".join(encode("pcm", pcm, piece=7_777, rate=rate)), "<i2")
    assert abs(len(out) - 2 * rate) <= 2
    assert peak_hz(out, rate) == pytest.approx(440.0, abs=1.0)
    # the same samples a single resampler gives the whole tone at once: the cuts left no trace
    whole = np.frombuffer(b"".join(encode("pcm", pcm, piece=len(pcm), rate=rate)), "<i2")
    assert np.array_equal(out, whole)


def test_wav_at_a_rate_says_it_in_its_header() -> None:
    data = b"".join(encode("wav", tone(1.0), piece=4_801, rate=16_000))
    assert data[:4] == b"RIFF"
    assert int.from_bytes(data[24:28], "little") == 16_000  # its sample rate
    assert int.from_bytes(data[28:32], "little") == 32_000  # its bytes per second
    assert decoded_seconds("wav", data) == pytest.approx(1.0, abs=0.001)
    empty = create_encoder(FORMATS["wav"].at(8_000))
    assert int.from_bytes(b"".join(empty.flush())[24:28], "little") == 8_000  # header alone


@pytest.mark.parametrize(("fmt", "codec"), [("ulaw_8000", "ulaw"), ("alaw_8000", "alaw")])
def test_g711_is_a_byte_a_sample_at_8_khz_and_matches_a_reference(fmt: str, codec: str) -> None:
    """The telephone's G.711 from the 24 kHz voice: 8000 bytes a second exactly, each byte the
    code of the 8 kHz sample, checked against CPython's audioop (an implementation of its own,
    from Sun's g711.c, not FFmpeg's tables) and literal codes. The two put a sample within four
    values of a decision level on its two sides (FFmpeg rounds to the nearer of the levels'
    midpoints, audioop truncates), one code apart: 0.8 % of the 16-bit values for mu-law, 1.5 %
    for A-law, so at most 3 % of a voice's samples may differ, and only so."""
    with warnings.catch_warnings():  # audioop is in 3.12's library, deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop
    pcm = tone(2.0)
    coded = b"".join(encode(fmt, pcm, piece=7_777))
    assert len(coded) == 16_000
    eight_khz = b"".join(encode("pcm", pcm, piece=7_777, rate=8_000))  # the same resampling
    reference = getattr(audioop, f"lin2{codec}")(eight_khz, 2)
    differ = np.frombuffer(coded, np.uint8) != np.frombuffer(reference, np.uint8)
    assert np.count_nonzero(differ) <= 3 * len(coded) // 100
    back = np.frombuffer(getattr(audioop, f"{codec}2lin")(coded, 2), "<i2").astype(np.int64)
    ref_back = np.frombuffer(getattr(audioop, f"{codec}2lin")(reference, 2), "<i2")
    original = np.frombuffer(eight_khz, "<i2").astype(np.int64)
    # within G.711's quantization: a sixteenth of the level (4 bits of mantissa), or its
    # smallest step; where the codes differ, neighbouring levels
    assert np.all(np.abs(back - original) <= np.abs(original) // 16 + 16)
    step = np.abs(back - ref_back)[differ]
    assert np.all(step <= np.abs(original[differ]) // 8 + 16)
    assert peak_hz(back, 8_000) == pytest.approx(440.0, abs=1.0)
    # G.711's own codes for silence and the two extremes (mu-law inverts its bits, A-law
    # toggles every other one): the reference's, and ours for silence
    silence, loudest, lowest = {"ulaw": (0xFF, 0x80, 0x00), "alaw": (0xD5, 0xAA, 0x2A)}[codec]
    extremes = np.array([0, 32767, -32768], "<i2").tobytes()
    assert getattr(audioop, f"lin2{codec}")(extremes, 2) == bytes([silence, loudest, lowest])
    quiet = b"".join(encode(fmt, bytes(4_800), piece=1_001))
    assert quiet == bytes([silence]) * 800
