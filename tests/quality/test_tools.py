"""The quality tools' pure parts: the word error rate, the corpus format, and the resampling and
decoding in front of the judges (no model needed)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from kokoro_contract.formats import FORMATS
from quality import corpus, judges
from quality.baseline import Baseline
from quality.wer import WordErrors, edit_distance, total, word_errors, words


def test_words_lowercase_drop_punctuation_keep_apostrophes_split_hyphens() -> None:
    assert words("Sure, I can't -- it's twenty-nine DOLLARS!") == [
        "sure",
        "i",
        "can't",
        "it's",
        "twenty",
        "nine",
        "dollars",
    ]


@pytest.mark.parametrize(
    ("ref", "hyp", "distance"),
    [
        ("a b c", "a b c", 0),
        ("a b c", "a x c", 1),  # substitution
        ("a b c", "a c", 1),  # deletion
        ("a b c", "a b b c", 1),  # insertion
        ("a b c", "", 3),
        ("", "a b", 2),
        ("the cat sat", "cat sat on the mat", 4),
    ],
)
def test_edit_distance(ref: str, hyp: str, distance: int) -> None:
    assert edit_distance(ref.split(), hyp.split()) == distance


def test_word_errors_are_summed_over_the_corpus_not_averaged() -> None:
    short = word_errors("yes", "no")  # 1 of 1
    long = word_errors("one two three four five six seven eight nine", "one two three")
    assert short.rate == 1.0
    assert long.rate == pytest.approx(6 / 9)
    assert total([short, long]) == WordErrors(7, 10)
    assert total([]).rate == 0.0


def test_corpus_parses_replies_and_refuses_a_line_without_a_reference() -> None:
    replies = corpus.parse("# note\nA one. | a one\nB two? | b two\n\n\nC three. | c three\n")
    assert [r.text for r in replies] == ["A one. B two?", "C three."]
    assert replies[0].spoken == "a one b two"
    with pytest.raises(ValueError, match="line 2"):
        corpus.parse("A. | a\nno reference here\n")


def test_the_corpus_is_varied_enough_to_judge() -> None:
    replies = corpus.load()
    sentences = corpus.sentences(replies)
    assert len(sentences) >= 30
    assert all(len(r.sentences) >= 3 for r in replies)  # every reply has joins
    text = " ".join(s.text for s in sentences)
    for feature in ("$", "%", ":", "?", "Dr.", "rd "):
        assert feature in text, feature
    assert max(len(s.text) for s in sentences) > 90  # a long clause


def test_baseline_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "baseline.json"
    Baseline("jm_kumo", 30, 200).write(path)
    assert Baseline.read(path) == Baseline("jm_kumo", 30, 200)
    assert Baseline.read().words > 0  # the stored one is readable


def tone(freq: float, rate: int, seconds: float) -> judges.Samples:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def peak_hz(samples: judges.Samples) -> float:
    spectrum = np.abs(np.fft.rfft(samples))
    return float(np.argmax(spectrum) * judges.JUDGE_RATE / len(samples))


def test_resample_keeps_length_and_pitch() -> None:
    out = judges.resample(tone(1000.0, 24_000, 1.0), 24_000)
    assert abs(len(out) - 16_000) <= 32  # the resampler's delay, at most
    assert peak_hz(out) == pytest.approx(1000.0, abs=2.0)
    assert 0.45 < float(np.max(np.abs(out[100:-100]))) < 0.55


@pytest.mark.parametrize("name", sorted(FORMATS))
def test_decode_reads_back_what_each_encoder_wrote(name: str) -> None:
    samples = tone(440.0, 24_000, 2.0)
    pcm = (samples * 32767).astype("<i2").tobytes()
    out = judges.round_trip(pcm, FORMATS[name])
    assert abs(len(out) / judges.JUDGE_RATE - 2.0) < 0.1  # priming and padding at most
    assert peak_hz(out) == pytest.approx(440.0, abs=2.0)


def test_bitrate_variants_change_the_encoded_size() -> None:
    pcm = (tone(440.0, 24_000, 2.0) * 32767).astype("<i2").tobytes()
    sizes = []
    for kbps in (32, 96):
        variant = dataclasses.replace(FORMATS["mp3"], bit_rate=kbps * 1000)
        sizes.append(len(judges.encode(pcm, variant)))
    assert sizes[1] > 2.5 * sizes[0]
