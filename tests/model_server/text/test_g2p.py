from __future__ import annotations

import logging

import pytest

from model_server.text import g2p
from model_server.text.g2p import EspeakG2P, english_g2p


@pytest.fixture(scope="module")
def espeak() -> EspeakG2P:
    return EspeakG2P()


def test_english_becomes_kokoro_phonemes(espeak: EspeakG2P) -> None:
    assert espeak("Hello there.") == "həlˈO ðˈɛɹ."
    assert espeak("It has three sentences.") == "ɪt həz θɹˈi sˈɛntənsᵻz."


def test_numbers_are_normalised_before_g2p(espeak: EspeakG2P) -> None:
    assert espeak("It costs $5.") == espeak("It costs five dollars.")
    assert espeak("See Dr. Lee.") == espeak("See Doctor Lee.")


def test_am_and_pm_are_read_as_letters(espeak: EspeakG2P) -> None:
    # "a m" would read as the article and "em": the listener heard "ten thirty I am"
    assert espeak("Come at 10:30 am.") == espeak("Come at ten thirty AM.")
    assert "ˌAˈɛm" in espeak("Come at 10:30 a.m.")
    assert "pˌiˈɛm" in espeak("Leave at 2:15 PM.")


def test_phonemizers_word_count_warning_is_not_logged(
    espeak: EspeakG2P, caplog: pytest.LogCaptureFixture
) -> None:
    # phonemizer warns "words count mismatch on 100.0% of the lines (1/1)" for this ordinary
    # sentence (and 6 more of the quality corpus): noise in every operator's log
    with caplog.at_level(logging.INFO):
        phonemes = espeak("The clinic is on the second floor, next to the pharmacy.")
        logging.getLogger("phonemizer").warning("another phonemizer warning")
    assert phonemes.startswith("ðə klˈɪnɪk")
    assert [r.getMessage() for r in caplog.records if r.name == "phonemizer"] == [
        "another phonemizer warning"
    ]


def test_without_spacy_model_the_espeak_path_is_used() -> None:
    assert not g2p.spacy_model_installed("no_such_spacy_model_pkg")
    assert isinstance(english_g2p(), EspeakG2P) or g2p.spacy_model_installed()


def test_a_broken_lexicon_install_falls_back_cleanly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(g2p, "spacy_model_installed", lambda name="en_core_web_sm": True)

    class Broken:
        def __init__(self, british: bool = False) -> None:
            raise ImportError("spaCy is broken")

    monkeypatch.setattr(g2p, "LexiconG2P", Broken)
    assert isinstance(english_g2p(), EspeakG2P)


# --- Japanese -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def japanese() -> g2p.JapaneseG2P:
    return g2p.JapaneseG2P()


def test_japanese_becomes_kokoro_phonemes_offline(japanese: g2p.JapaneseG2P) -> None:
    """pyopenjtalk-plus's readings (its dictionary from its wheel) through the romaniser
    Kokoro was trained with: kanji, kana, numbers and punctuation."""
    assert japanese("こんにちは。今日はいい天気ですね。") == "koɲɲiʨiβa. kʲoː βa ii teŋkʲi desɨ ne."
    assert japanese("ご注文は昨日、発送されました！") == "ɡo ʨɨːmoɴ βa kʲinoː, haʔsoː saɾe maɕita!"
    assert japanese("3個") == japanese("三個")  # numbers read in Japanese


def test_japanese_phonemes_are_in_kokoros_vocabulary(japanese: g2p.JapaneseG2P) -> None:
    from model_server.engines.weights import load_vocab

    vocab = load_vocab()
    text = "ポートランドの倉庫から、木曜日の午後に届く予定です。追跡番号はメールでお送りします？"
    assert set(japanese(text)) <= set(vocab) | {" "}


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name
        self.texts: list[str] = []

    def __call__(self, text: str) -> str:
        self.texts.append(text)
        return self.name


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("Hello there.", "en"),
        ("こんにちは。", "ja"),
        ("東京タワー", "ja"),
        ("你好！", "ja"),  # Chinese has no G2P of its own here: the Japanese readings
        ("Your order from 東京 shipped today.", "en"),  # mostly English
        ("Tokyo は東京です。", "ja"),  # mostly Japanese
        ("3.14 — 100%", "en"),  # no letters at all
    ],
)
def test_the_texts_script_chooses_the_g2p(text: str, language: str) -> None:
    english, made = _Named("en"), []

    def japanese() -> _Named:
        made.append(_Named("ja"))
        return made[-1]

    chooser = g2p.ScriptG2P(english, japanese)
    assert chooser(text) == language
    assert chooser(text) == language
    assert len(made) == (language == "ja")  # made once, when first needed, never for English


def test_the_japanese_share_counts_a_kanji_as_the_chunker_does() -> None:
    assert g2p.japanese_share("ab東") == pytest.approx(2.5 / 4.5)  # CJK_CHAR_WEIGHT letters
    assert g2p.japanese_share("abc") == 0.0
    assert g2p.japanese_share("、。 123") == 0.0
