from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from model_server.text.split import split_phonemes


def test_each_sentence_is_a_segment() -> None:
    assert split_phonemes("həlˈO ðˈɛɹ. haʊ ɑɹ ju? fˈIn!") == ["həlˈO ðˈɛɹ.", "haʊ ɑɹ ju?", "fˈIn!"]


def test_long_sentence_splits_at_clauses_then_words() -> None:
    clause = "ə " * 20 + "b,"
    text = " ".join([clause] * 6).strip()
    segments = split_phonemes(text, max_len=100)
    assert all(len(s) <= 100 for s in segments)
    assert all(s.endswith(",") for s in segments[:-1])
    assert " ".join(segments) == text


def test_a_word_over_the_limit_is_cut_not_dropped() -> None:
    assert split_phonemes("x" * 25, max_len=10) == ["x" * 10, "x" * 10, "x" * 5]


_alphabet = st.sampled_from([*list("abɹəˈ ,.!?;:—…"), "  ", "\n"])


@given(st.lists(_alphabet, max_size=400).map("".join), st.integers(min_value=1, max_value=120))
def test_segments_fit_and_lose_nothing(text: str, max_len: int) -> None:
    segments = split_phonemes(text, max_len)
    assert all(0 < len(s) <= max_len for s in segments)
    assert "".join("".join(segments).split()) == "".join(text.split())


def test_packed_sentences_share_segments_up_to_the_limit() -> None:
    text = "həlˈO ðˈɛɹ. haʊ ɑɹ ju? fˈIn!"
    assert split_phonemes(text, pack=True) == [text]
    assert split_phonemes(text, max_len=22, pack=True) == ["həlˈO ðˈɛɹ. haʊ ɑɹ ju?", "fˈIn!"]
    long = "ə " * 60 + "b."
    packed = split_phonemes(f"{long} {text}", max_len=100, pack=True)
    assert all(len(s) <= 100 for s in packed)
    assert " ".join(packed) == f"{long} {text}".replace("  ", " ").strip()
