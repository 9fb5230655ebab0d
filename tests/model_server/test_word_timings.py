"""Word timings (issue #12), model-server side: the word map (text/words.py), the clock that
reads the model's durations through it (timings.py), the protocol on both routes over the fake
engine, and, with the real Kokoro-82M weights, the timed variant's audio against the
original's and the timings against the waveform."""

from __future__ import annotations

import base64
import difflib
import itertools
import string
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import httpx
import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.client import ClientConnection, connect

from kokoro_contract.protocol import WordTiming, parse_words
from model_server.audio import TrimPolicy
from model_server.engines.base import Timed, char_durations
from model_server.text.normalize import normalize, normalize_spans
from model_server.text.split import split_phonemes
from model_server.text.words import _WINDOW as WINDOW
from model_server.text.words import WordMap, map_words, word_pieces
from model_server.timings import WordClock, locate
from tests.support.fakes import FakeEngine, IdentityG2P, expected_pcm_bytes
from tests.support.model_server_client import synth
from tests.support.servers import RunningServer

BIDI = "/invocations-bidirectional-stream"
RATE = 24_000
TAIL = int(TrimPolicy().tail_s * RATE)  # the pause trimming leaves after each segment

# --- the word map ------------------------------------------------------------------------------

NORMALIZED = [
    "It costs $29.99, at 10:30 a.m. on Jan. 5th.",
    "Dr. Smith paid $2.5 million for No. 5; e.g. the U.S. office grew 3.5% in 1999.",
    "Version 1.2.3 shipped on the 21st, etc. Call 555 1234 now!",
    "Ms. Jones — approx. 1,234,567 people — said 7:05 PM, i.e. late.",
    "£3 and €0.50 and $ 12k",
]


@pytest.mark.parametrize("text", NORMALIZED)
def test_normalize_spans_is_normalize_with_sources(text: str) -> None:
    normalized, spans = normalize_spans(text)
    assert normalized == normalize(text)
    assert len(spans) == len(normalized)
    starts = [start for start, _ in spans]
    assert starts == sorted(starts)  # in the text's order
    assert all(0 <= start < end <= len(text) for start, end in spans)


def test_an_expansion_reads_the_whole_match() -> None:
    text = "It costs $29.99, at 10:30 a.m."
    normalized, spans = normalize_spans(text)
    assert normalized == "It costs twenty-nine dollars and ninety-nine cents, at ten thirty AM."
    read = {text[a:b] for a, b in spans[normalized.index("twenty") : normalized.index(",")]}
    assert read == {"$29.99"}
    assert {text[a:b] for a, b in spans[normalized.index("ten") :]} == {"10:30 a.m."}
    assert [text[a:b] for a, b in spans[:8]] == list("It costs")


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=string.digits + "$€£.,:%-apmAPM Drst No.\t", max_size=40))
def test_normalize_spans_matches_normalize_on_any_text(text: str) -> None:
    normalized, spans = normalize_spans(text)
    assert normalized == normalize(text)
    assert len(spans) == len(normalized)


def _pieces(text: str) -> list[str]:
    return [text[a:b] for a, b in word_pieces(text)]


def test_a_word_keeps_its_spelling_and_expansions_read_together_are_one_word() -> None:
    assert _pieces("It costs $29.99, at 10:30 a.m. on Jan. 5th.") == [
        "It", "costs", "$29.99,", "at", "10:30 a.m.", "on", "Jan. 5th.",  # "January fifth"
    ]  # fmt: skip
    assert _pieces("Paid $2.5 million, i.e. a lot; No. 5 — U.S. 3.5 %") == [
        "Paid", "$2.5 million,", "i.e.", "a", "lot;", "No.", "5", "—", "U.S.", "3.5 %",
    ]  # fmt: skip
    assert _pieces("  one\ttwo  ") == ["one", "two"]
    assert _pieces("") == []


def _voiced_spans(words: WordMap) -> list[str]:
    return [words.phonemes[a:b] for a, b in words.spans]


def test_with_the_identity_g2p_every_word_is_its_characters_without_punctuation() -> None:
    text = "Well, I think so. But — maybe not! (Or $5?)"
    words = map_words(text, IdentityG2P()(text), IdentityG2P())
    assert words.words == ("Well,", "I", "think", "so.", "But", "maybe", "not!", "(Or", "$5?)")
    assert _voiced_spans(words) == ["Well", "I", "think", "so", "But", "maybe", "not", "Or", "$5"]


class MergingG2P:
    """Reads "of the" as one phoneme word in context, as espeak-ng may, and every word alone
    with stress: the word counts differ, so words are lined up character by character."""

    name = "merging"
    LEXICON: ClassVar[dict[str, str]] = {
        "most": "mˈOst",
        "of": "ʌv",
        "the": "ðə",
        "time,": "tˈIm,",
        "yes.": "jˈɛs.",
    }

    def __call__(self, text: str) -> str:
        if " " not in text.strip():
            return "ˈ" + self.LEXICON[text.strip()].replace("ˈ", "")
        return "mˈOst ʌvðə tˈIm, jˈɛs."


def test_words_are_lined_up_character_by_character_when_the_word_counts_differ() -> None:
    text = "most of the time, yes."
    g2p = MergingG2P()
    words = map_words(text, g2p(text), g2p)
    assert words.words == ("most", "of", "the", "time,", "yes.")
    assert _voiced_spans(words) == ["mˈOst", "ʌv", "ðə", "tˈIm", "jˈɛs"]


class LongMergingG2P(MergingG2P):
    """The same, over a long text: its phonemes word by word, "of the" run together."""

    def __call__(self, text: str) -> str:
        if " " not in text.strip():
            return super().__call__(text)
        return " ".join(self.LEXICON[w] for w in text.split()).replace("ʌv ðə", "ʌvðə")


def test_a_long_text_is_lined_up_in_linear_work_and_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole-text difflib took 19 s on 4,900 characters (its work grows with the product of
    the lengths it compares). Counted, not timed: every comparison is within one window, and
    twice the text costs twice the comparing."""
    compared: list[tuple[int, int]] = []  # (len(a), len(b)) of every SequenceMatcher made

    class CountingMatcher(difflib.SequenceMatcher[str]):
        def __init__(self, isjunk: Any = None, a: Any = "", b: Any = "", autojunk: bool = True):
            super().__init__(isjunk, a, b, autojunk)
            compared.append((len(a), len(b)))

    monkeypatch.setattr(difflib, "SequenceMatcher", CountingMatcher)
    work = {}
    for repeats in (200, 400):  # 200: 4,600 characters, the longest a request may be
        compared.clear()
        text = "most of the time, yes. " * repeats
        g2p = LongMergingG2P()
        words = map_words(text, g2p(text), g2p)
        assert words.words == ("most", "of", "the", "time,", "yes.") * repeats
        assert _voiced_spans(words) == ["mˈOst", "ʌv", "ðə", "tˈIm", "jˈɛs"] * repeats
        assert compared  # lined up character by character, so compared
        assert max(max(pair) for pair in compared) <= WINDOW
        work[repeats] = sum(a * b for a, b in compared)
    assert work[400] <= 2.2 * work[200], work  # linear: n**2 would be 4 times


def test_a_word_the_g2p_cannot_read_alone_is_placed_by_its_neighbours() -> None:
    def g2p(text: str) -> str:
        if text == "zzz":
            raise RuntimeError("no")
        return text

    words = map_words("a zzz b", "a zzz b", g2p)
    assert words.words == ("a", "zzz", "b")
    assert _voiced_spans(words) == ["a", "zzz", "b"]


# --- phonemes in segments ------------------------------------------------------------------------

PHONEMES = st.text(alphabet="abcˈə .,!?—  \t", max_size=80)


@settings(max_examples=200, deadline=None)
@given(PHONEMES, st.integers(min_value=1, max_value=30), st.booleans())
def test_every_segment_character_is_found_in_the_phonemes(
    phonemes: str, max_len: int, pack: bool
) -> None:
    segments = split_phonemes(phonemes, max_len, pack=pack)
    located = locate(phonemes, segments)
    previous = -1
    for segment, where in zip(segments, located, strict=True):
        assert len(where) == len(segment)
        for char, index in zip(segment, where, strict=True):
            if not char.isspace():
                assert phonemes[index] == char
                assert index > previous
                previous = index


def test_a_segment_that_is_not_the_next_piece_is_a_bug() -> None:
    with pytest.raises(ValueError, match="not the phonemes' next piece"):
        locate("ab cd", ["ab", "xx"])


def test_durations_per_character_put_dropped_characters_at_zero() -> None:
    vocab = {"a": 1, "b": 2}
    out = char_durations("a?b", vocab, np.array([[5, 2, 3, 7]]))
    assert out.tolist() == [5, 2, 0, 3, 7]


# --- the clock -----------------------------------------------------------------------------------


def _timed(frames: Sequence[int], loud: Sequence[tuple[int, int]], frame: int = 100) -> Timed:
    """An engine's output: these frames (pads included), audible over the `loud` ranges of
    samples, silent elsewhere."""
    durations = np.array(frames, np.int64)
    audio = np.zeros(int(durations.sum()) * frame, np.float32)
    for start, end in loud:
        audio[start:end] = 0.5
    return Timed(audio, durations, frame)


def test_word_times_come_from_the_frames_inside_the_audible_part() -> None:
    phonemes = "ab, cd"
    words = WordMap(phonemes, ("ab,", "cd"), ((0, 2), (4, 6)))
    trim = TrimPolicy(lead_s=0.005)  # 120 samples before the first loud one
    # frames, 100 samples each: pad 3 | a 1 | b 2 | , 4 | space 1 | c 1 | d 2 | pad 2
    # so a: 300-400, b: 400-600, ",": 600-1000, c: 1100-1200, d: 1200-1400 (samples)
    timed = _timed([3, 1, 2, 4, 1, 1, 2, 2], [(250, 1_300)])
    cut = 250 - 120
    got = WordClock(words, [phonemes], trim).segment(0, timed, sent=2_400)
    assert got == [
        WordTiming("ab,", (2_400 + 300 - cut) / RATE, (2_400 + 600 - cut) / RATE),
        WordTiming("cd", (2_400 + 1_100 - cut) / RATE, (2_400 + 1_300 - cut) / RATE),  # audible
    ]
    # a word that starts before the voice is heard starts when it is
    timed = _timed([3, 1, 2, 4, 1, 1, 2, 2], [(350, 1_400)])
    got = WordClock(words, [phonemes], TrimPolicy(lead_s=0)).segment(0, timed, sent=0)
    assert got[0] == WordTiming("ab,", 0.0, (600 - 350) / RATE)


def test_a_word_ends_where_its_sound_does_when_its_last_frames_are_a_pause() -> None:
    phonemes = "ab cd ef"
    words = WordMap(phonemes, ("ab", "cd", "ef"), ((0, 2), (3, 5), (6, 8)))
    # 600 samples a frame: pad 1 | a 1 | b 10 | space 1 | c 1 | d 3 | space 1 | e 1 | f 1 | pad 1
    # a: 600-1200, b: 1200-7200, c: 7800-8400, d: 8400-10200, e: 10800-11400, f: 11400-12000
    timed = _timed(
        [1, 1, 10, 1, 1, 3, 1, 1, 1, 1], [(600, 2_000), (7_800, 9_000), (10_800, 12_000)], 600
    )
    got = WordClock(words, [phonemes], TrimPolicy(lead_s=0)).segment(0, timed, sent=0)
    cut = 600
    assert got == [
        WordTiming("ab", 0.0, (2_000 - cut) / RATE),  # 5,200 silent samples: a pause
        WordTiming("cd", (7_800 - cut) / RATE, (10_200 - cut) / RATE),  # 1,200: a closure
        WordTiming("ef", (10_800 - cut) / RATE, (12_000 - cut) / RATE),
    ]


def test_a_word_cut_across_segments_is_reported_once_where_it_ends() -> None:
    phonemes = "abcdef gh"
    words = WordMap(phonemes, ("abcdef", "gh"), ((0, 6), (7, 9)))
    segments = split_phonemes(phonemes, max_len=4)
    assert segments == ["abcd", "ef", "gh"]
    clock = WordClock(words, segments, TrimPolicy(lead_s=0))
    first = clock.segment(0, _timed([0, 1, 1, 1, 1, 0], [(0, 400)]), sent=0)
    second = clock.segment(1, _timed([0, 1, 1, 0], [(0, 200)]), sent=400)
    third = clock.segment(2, _timed([0, 1, 1, 0], [(0, 200)]), sent=600)
    assert first == []
    assert second == [WordTiming("abcdef", 0.0, 600 / RATE)]
    assert third == [WordTiming("gh", 600 / RATE, 800 / RATE)]


def test_a_silent_segments_words_last_nothing_and_the_next_ones_still_come() -> None:
    phonemes = "ab. cd."
    words = WordMap(phonemes, ("ab.", "cd."), ((0, 2), (4, 6)))
    segments = split_phonemes(phonemes)
    assert segments == ["ab.", "cd."]
    clock = WordClock(words, segments, TrimPolicy(lead_s=0))
    silent = clock.segment(0, _timed([0, 1, 1, 1, 0], []), sent=0)
    assert silent == [WordTiming("ab.", 0.0, 0.0)]  # the synthesizer sends neither
    assert clock.segment(1, _timed([0, 1, 1, 1, 0], [(0, 300)]), sent=0) == [
        WordTiming("cd.", 0.0, 200 / RATE)
    ]


# --- the fake engine's timings through the real routes --------------------------------------------

FRAME_S = 0.01  # FakeEngine: one phoneme (character) is 10 ms at speed 1


def _fake_words(text: str) -> list[tuple[str, float, float]]:
    """What the model server must say for `text` over the fake engine and the identity G2P:
    each sentence one segment, every character 10 ms, each segment followed by the trim's
    pause; a word runs from its first to its last character that is not punctuation."""
    out = []
    offset = 0.0
    for segment in split_phonemes(text):
        words = map_words(segment, segment, IdentityG2P())
        for word, (a, b) in zip(words.words, words.spans, strict=True):
            out.append((word, round(offset + a * FRAME_S, 3), round(offset + b * FRAME_S, 3)))
        offset += expected_pcm_bytes(segment) / 2 / RATE
    return out


async def _frames_until_done(ws: ClientConnection, rid: str) -> list[Any]:
    """Every frame of one request in order: JSON events as dicts, audio as bytes."""
    frames: list[Any] = []
    async for frame in ws:
        if isinstance(frame, bytes):
            frames.append(frame)
            continue
        event = orjson.loads(frame)
        frames.append(event)
        terminal = event["type"] in {"synthesis_complete", "error", "synthesis_cancelled"}
        if terminal and event.get("request_id") == rid:
            return frames
    raise AssertionError(f"closed early: {frames}")


def _kinds(frames: list[Any]) -> list[str]:
    return ["audio" if isinstance(f, bytes) else f["type"] for f in frames]


def _triples(items: object) -> list[tuple[str, float, float]]:
    return [(w.word, w.start, w.end) for w in parse_words(items)]


TWO_SENTENCES = "One two, three. Four $5 (five)!"


async def test_word_timings_come_before_each_segments_audio(fake_server: RunningServer) -> None:
    async with connect(fake_server.ws_url + BIDI) as ws:
        await ws.send(synth(TWO_SENTENCES, "t1", timestamps=True))
        frames = await _frames_until_done(ws, "t1")
    assert _kinds(frames) == [
        "synthesis_start", "word_timings", "audio", "word_timings", "audio", "synthesis_complete",
    ]  # fmt: skip
    first, second = frames[1], frames[3]
    assert first["request_id"] == second["request_id"] == "t1"
    assert len(frames[2]) == expected_pcm_bytes("One two, three.")
    words = _triples(first["words"]) + _triples(second["words"])
    assert words == _fake_words(TWO_SENTENCES)
    assert [w for w, _, _ in words] == ["One", "two,", "three.", "Four", "$5", "(five)!"]
    # the second segment's words count from the request's first sample, after the first's pause
    assert words[3][1] == pytest.approx(len(frames[2]) / 2 / RATE)
    assert frames[-1]["audio_bytes"] == len(frames[2]) + len(frames[4])


async def test_without_timestamps_nothing_changes(fake_server: RunningServer) -> None:
    async with connect(fake_server.ws_url + BIDI) as ws:
        for rid, extra in (("plain", {}), ("off", {"timestamps": False})):
            await ws.send(synth(TWO_SENTENCES, rid, **extra))
            frames = await _frames_until_done(ws, rid)
            assert _kinds(frames) == ["synthesis_start", "audio", "audio", "synthesis_complete"]


async def test_timestamps_must_be_a_boolean(fake_server: RunningServer) -> None:
    async with connect(fake_server.ws_url + BIDI) as ws:
        await ws.send(synth("Hi.", "bad", timestamps="yes"))
        error = orjson.loads(await ws.recv())
        assert (error["type"], error["code"], error["request_id"]) == (
            "error",
            "invalid_field",
            "bad",
        )


async def test_a_packed_request_gets_one_frame_for_its_one_segment(
    fake_server: RunningServer,
) -> None:
    async with connect(fake_server.ws_url + BIDI) as ws:
        await ws.send(synth(TWO_SENTENCES, "packed", timestamps=True, deadline_ms=500))
        frames = await _frames_until_done(ws, "packed")
    assert _kinds(frames) == ["synthesis_start", "word_timings", "audio", "synthesis_complete"]
    words = _triples(frames[1]["words"])
    assert [w for w, _, _ in words] == ["One", "two,", "three.", "Four", "$5", "(five)!"]
    assert words[3][1] == pytest.approx(TWO_SENTENCES.index("Four") * FRAME_S)


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
async def test_post_with_timestamps_answers_json_audio_and_words(
    fake_server: RunningServer, fmt: str
) -> None:
    body = {"text": TWO_SENTENCES, "format": fmt}
    async with httpx.AsyncClient(base_url=fake_server.http_url, timeout=30) as http:
        plain = await http.post("/invocations", json=body)
        timed = await http.post("/invocations", json={**body, "timestamps": True})
    assert plain.status_code == timed.status_code == 200
    assert timed.headers["content-type"] == "application/json"
    answer = timed.json()
    assert set(answer) == {"audio", "format", "sample_rate", "words"}
    assert (answer["format"], answer["sample_rate"]) == (fmt, RATE)
    assert base64.b64decode(answer["audio"]) == plain.content  # the same audio, the same format
    assert _triples(answer["words"]) == _fake_words(TWO_SENTENCES)
    assert timed.headers["x-audio-duration-s"] == plain.headers["x-audio-duration-s"]
    assert timed.headers["x-request-id"]


async def test_post_streamed_with_timestamps_is_refused(fake_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url, timeout=30) as http:
        refused = await http.post(
            "/invocations", json={"text": "Hi.", "stream": True, "timestamps": True}
        )
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid_field"
    assert "timestamps need stream false" in error["message"]


async def test_post_without_timestamps_is_audio_as_before(fake_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url, timeout=30) as http:
        plain = await http.post("/invocations", json={"text": "Hi.", "timestamps": False})
    assert plain.headers["content-type"].startswith("audio/pcm")
    assert len(plain.content) == expected_pcm_bytes("Hi.")


def test_the_fake_engines_durations_add_up_to_its_audio() -> None:
    from model_server.engines.base import CancelToken

    engine = FakeEngine()
    for speed in (0.5, 1.0, 1.3, 2.0):
        timed = engine.infer_timed("Hello there.", "af_test", speed, CancelToken())
        assert timed.durations.sum() * timed.frame_samples == timed.audio.size
        assert timed.durations.size == len("Hello there.") + 2


# --- the real Kokoro-82M weights -----------------------------------------------------------------
# (the real-model tests below use the model server's engine and weights; marked real_model)


@dataclass(frozen=True)
class Spoken:
    """A sentence of the table: its words as the timings must name them, the words after
    which the listener hears a pause at punctuation, and abbreviations after which none."""

    text: str
    words: tuple[str, ...]
    pauses: tuple[str, ...] = ()
    no_pauses: tuple[str, ...] = ()


TABLE = [
    Spoken("Hello there.", ("Hello", "there.")),
    Spoken(
        "It costs $29.99, at 10:30 a.m. on Jan. 5th.",
        ("It", "costs", "$29.99,", "at", "10:30 a.m.", "on", "Jan. 5th."),
        pauses=("$29.99,",),
    ),
    Spoken(
        "Dr. Smith paid $2.5 million for 42 cats in 1999.",
        ("Dr.", "Smith", "paid", "$2.5 million", "for", "42", "cats", "in", "1999."),
        no_pauses=("Dr.",),
    ),
    Spoken(
        "Well, I think so. But then again, maybe not!",
        ("Well,", "I", "think", "so.", "But", "then", "again,", "maybe", "not!"),
        pauses=("so.",),
    ),
    Spoken(
        "The U.S. office grew 3.5% — e.g. from 1,200 to 1,242 people.",
        (
            "The",
            "U.S.",
            "office",
            "grew",
            "3.5%",
            "e.g.",
            "from",
            "1,200",
            "to",
            "1,242",
            "people.",
        ),
        pauses=("3.5%",),
        no_pauses=("U.S.", "e.g."),
    ),
    Spoken(
        "Stop. Wait; listen: three, two, one.",
        ("Stop.", "Wait;", "listen:", "three,", "two,", "one."),
        pauses=("Stop.",),
    ),
]
SENTENCES = [spoken.text for spoken in TABLE]


@pytest.fixture(scope="module")
def kokoro() -> Any:
    """The real weights as the server loads them: the original graph and its timed variant,
    on onnxruntime (2 threads), with the G2P, vocab and a voice pack."""
    import onnxruntime as ort

    from model_server.engines import voices
    from model_server.engines.weights import (
        assemble_model,
        default_cache_dir,
        load_vocab,
        timed_model,
    )
    from model_server.text.g2p import english_g2p

    cache = default_cache_dir()
    original = assemble_model(cache)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2

    def session(path: Any) -> Any:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    packs, _ = voices.load_voices(None)
    return {
        "original": session(original),
        "timed": session(timed_model(original, cache)),
        "vocab": load_vocab(),
        "g2p": english_g2p(),
        "pack": packs["jm_kumo"],
    }


@pytest.mark.real_model
def test_the_timed_variant_voices_exactly_the_originals_audio(kokoro: Any) -> None:
    """The assembled variant, checked against the original on the sentence table: the same
    samples, bit for bit, and its durations add up to the audio (600 samples a frame)."""
    for text in SENTENCES:
        tokens = [kokoro["vocab"][c] for c in kokoro["g2p"](text) if c in kokoro["vocab"]]
        feed = {
            "tokens": np.array([[0, *tokens, 0]], np.int64),
            "style": kokoro["pack"][len(tokens) - 1].reshape(1, -1).astype(np.float32),
            "speed": np.array([1.0], np.float32),
        }
        (original,) = kokoro["original"].run(["audio"], feed)
        audio, durations = kokoro["timed"].run(["audio", "durations"], feed)
        assert np.array_equal(audio, original), text
        assert durations.shape == (1, len(tokens) + 2)
        assert durations.min() >= 1
        assert abs(int(durations.sum()) * 600 - audio.size) < 600, text  # within one frame


FRAME = 120  # 5 ms: the waveform's level is read in frames this long


def _levels_db(audio: np.ndarray) -> np.ndarray:
    """The level of every 5 ms of `audio`, in dB (full scale)."""
    n = audio.size // FRAME
    frames = audio[: n * FRAME].reshape(n, FRAME).astype(np.float64)
    return np.asarray(20 * np.log10(np.sqrt(np.mean(frames**2, axis=1)) + 1e-9))


def _level(levels: np.ndarray, start: float, end: float) -> float:
    """The median level between two times: what most of the stretch sounds like."""
    return float(np.median(levels[int(start * RATE) // FRAME : int(end * RATE) // FRAME]))


@pytest.mark.real_model
@pytest.mark.parametrize("spoken", TABLE, ids=[t.text for t in TABLE])
async def test_word_timings_agree_with_the_waveform(
    model_server: RunningServer, spoken: Spoken
) -> None:
    async with connect(model_server.ws_url + BIDI, max_size=None) as ws:
        await ws.send(synth(spoken.text, "w", timestamps=True))
        frames = await _frames_until_done(ws, "w")
    kinds = _kinds(frames)
    assert kinds[0] == "synthesis_start"
    assert kinds[-1] == "synthesis_complete"
    words: list[WordTiming] = []
    pcm = bytearray()
    for i, frame in enumerate(frames):
        if kinds[i] == "word_timings":
            # the words that end in a piece of audio come just before it (a progressive
            # server's window that ends no word comes alone)
            assert kinds[i + 1] == "audio", kinds
            words += parse_words(frame["words"])
        elif kinds[i] == "audio":
            pcm += frame
    assert frames[-1]["audio_bytes"] == len(pcm)
    audio = np.frombuffer(bytes(pcm), "<i2").astype(np.float32) / 32768
    levels = _levels_db(audio)

    # every word, as the text spelled it, in order, inside the audio sent (times in ms on the
    # wire: half a millisecond of rounding)
    assert tuple(w.word for w in words) == spoken.words
    audible = np.flatnonzero(np.abs(audio) > TrimPolicy().threshold)
    first, past = audible[0] / RATE, (audible[-1] + 1) / RATE
    previous_end = 0.0
    for w in words:
        assert previous_end <= w.start < w.end <= past + 5e-4, (w, previous_end, past)
        previous_end = w.end
    # the first word starts when the voice does (trimming leaves 30 ms before it)
    assert 0 <= words[0].start - first + 5e-4 < 0.1, (words[0], first)

    speech = float(np.median([_level(levels, w.start, w.end) for w in words]))
    for w, after in itertools.pairwise(words):
        gap = after.start - w.end
        if w.word in spoken.pauses:  # the listener hears a pause, and the timings place it
            assert gap >= 0.1, (w, after)
            assert _level(levels, w.end, after.start) < speech - 20, (w, after, speech)
        if w.word in spoken.no_pauses:  # an abbreviation's period is no sentence end
            assert gap < 0.1, (w, after)
        if gap >= 0.15:  # wherever the durations put a long pause, the waveform is quiet
            assert _level(levels, w.end, after.start) < speech - 20, (w, after, speech)


@pytest.mark.real_model
async def test_post_answers_the_websockets_words_and_audio(model_server: RunningServer) -> None:
    text = "It costs $29.99, at 10:30 a.m."
    async with connect(model_server.ws_url + BIDI, max_size=None) as ws:
        await ws.send(synth(text, "ws", timestamps=True))
        frames = await _frames_until_done(ws, "ws")
    pcm = b"".join(f for f in frames if isinstance(f, bytes))
    words = [w for f in frames if isinstance(f, dict) and "words" in f for w in f["words"]]
    async with httpx.AsyncClient(base_url=model_server.http_url, timeout=60) as http:
        answer = await http.post("/invocations", json={"text": text, "timestamps": True})
    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/json"
    body = answer.json()
    assert base64.b64decode(body["audio"]) == pcm
    assert body["words"] == words
    assert [w["word"] for w in words] == ["It", "costs", "$29.99,", "at", "10:30 a.m."]
