from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from kokoro_contract import languages
from model_server.text import g2p
from model_server.text.g2p import EspeakG2P, english_g2p
from model_server.text.words import map_words
from tests.support.fakes import IdentityG2P


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


def _timed_words(reader: g2p.G2P, text: str) -> list[tuple[str, str]]:
    phonemes = reader(text)
    words = map_words(text, phonemes, reader)
    return [(w, phonemes[a:b]) for w, (a, b) in zip(words.words, words.spans, strict=True)]


def test_japanese_and_mandarin_are_timed_word_by_word(japanese: g2p.JapaneseG2P) -> None:
    """Written without spaces, they are timed by their readers' words (pyopenjtalk's, jieba's),
    each on the phonemes its reading made; punctuation is no word."""
    assert _timed_words(japanese, "ご注文は昨日、発送されました！") == [
        ("ご", "ɡo"),
        ("注文", "ʨɨːmoɴ"),
        ("は", "βa"),
        ("昨日", "kʲinoː"),
        ("発送", "haʔsoː"),
        ("さ", "sa"),
        ("れ", "ɾe"),
        ("まし", "maɕi"),
        ("た", "ta"),
    ]
    mandarin = g2p.MandarinG2P(IdentityG2P())
    assert _timed_words(mandarin, "你好，我们今天发货了。") == [
        ("你好", "ni↓xau↓"),
        ("我们", "wo↓mən"),
        ("今天", "ʨi→ntʰjɛ→n"),
        ("发货", "fa→xwo↘"),
        ("了", "lɤ"),
    ]


class _Named:
    def __init__(self, name: str) -> None:
        self.name = name
        self.texts: list[str] = []

    def __call__(self, text: str) -> str:
        self.texts.append(text)
        return self.name


@pytest.mark.parametrize(
    ("language", "voice", "text", "read_in"),
    [
        # no language asked: the script, then the voice
        (None, "jf_alpha", "Hello there.", "en-us"),  # a Japanese voice reads English text
        (None, "jf_alpha", "こんにちは。", "ja"),
        (None, "af_heart", "東京タワー", "ja"),
        (None, "af_heart", "你好！", "ja"),  # CJK with a voice not Mandarin's: Japanese
        (None, "zf_xiaobei", "你好！", "zh"),  # the same with a Mandarin voice
        (None, "zf_xiaobei", "Hello there.", "en-us"),
        (None, "af_heart", "Your order from 東京 shipped today.", "en-us"),  # mostly English
        (None, "af_heart", "Tokyo は東京です。", "ja"),  # mostly Japanese
        (None, "af_heart", "3.14 — 100%", "en-us"),  # no letters at all
        (None, "bf_emma", "Hello there.", "en-gb"),
        (None, "ef_dora", "Hola, ¿qué tal?", "es"),
        (None, "pm_santa", "Olá, tudo bem?", "pt-br"),
        (None, "someone", "Hello there.", "en-us"),  # a name with no language in it
        # asked: whatever the voice or the script
        ("fr", "jf_alpha", "Bonjour.", "fr"),
        ("en-gb", "af_heart", "Hello there.", "en-gb"),
        ("zh", "jf_alpha", "東京", "zh"),
        ("ja", "af_heart", "Hello", "ja"),
    ],
)
def test_the_language_asked_else_the_script_and_voice_choose_the_g2p(
    language: str | None, voice: str, text: str, read_in: str
) -> None:
    made: list[str] = []

    def maker(name: str) -> Callable[[], _Named]:
        def make() -> _Named:
            made.append(name)
            return _Named(name)

        return make

    names = [lang.name for lang in languages.LANGUAGES if lang.name != "en-us"]
    chooser = g2p.LanguageG2P(_Named("en-us"), {name: maker(name) for name in names})
    for _ in range(2):
        chosen, reader = chooser.choose(language, voice, text)
        assert (chosen.name, reader(text)) == (read_in, read_in)
    assert made == ([] if read_in == "en-us" else [read_in])  # made once, when first needed
    assert chooser(text) == g2p.choose_language(None, "", text).name  # called as a G2P


@pytest.mark.parametrize(
    ("language", "text", "phonemes"),
    [
        # espeak-ng's own rules for each: numbers read in the language, never English words
        ("es", "Tengo 25 euros.", "tˈɛŋɡo βˌAntiθˈinko ˈeʊɾos."),
        ("fr", "Bonjour, comment allez-vous ?", "bɔ̃ʒˈuʁ, kɔmˌɑ̃ alˈevˈu ?"),
        ("it", "Ciao, come stai?", "ʧˈao, kˌome stˈaj?"),
        ("pt-br", "Olá, tudo bem?", "olˈa, tˈudʊ bˈAŋ?"),
        ("hi", "नमस्ते", "nəmˈʌsteː"),
        ("en-gb", "Hello there.", "həlˈQ ðˈAə."),  # misaki's British symbols
        # misaki's Mandarin: tones as arrows, numerals as words
        ("zh", "你好，我们三点见面。", "ni↓xau↓, wo↓mən sa→ntjɛ↓n ʨjɛ↘nmjɛ↘n."),
        # its Latin words by the English G2P, never spelled as letters
        ("zh", "我用iPhone打电话。", "wo↓jʊ↘ŋ ˈI fˈOn ta↓tjɛ↘nxwa↘."),
    ],
)
def test_each_language_is_read_by_its_own_g2p(language: str, text: str, phonemes: str) -> None:
    chosen, reader = _REAL.choose(language, "af_heart", text)
    assert chosen.name == language
    assert reader(text) == phonemes
    assert reader.name.endswith("-gb") == (language == "en-gb")  # said apart in /phonemize


_REAL = g2p.default_g2p()


@pytest.mark.parametrize("language", ["en-us", "en-gb"])
def test_normalize_off_reads_english_as_written(language: str) -> None:
    text = "Call 415-555-0123, it costs $29.99."
    _, normalized = _REAL.choose(language, "af_heart", text)
    _, written = _REAL.choose(language, "af_heart", text, normalize="off")
    assert written.name == normalized.name + " (as written)"
    # espeak-ng's own reading, "four hundred fifteen dash ...", not a phone number's digits
    assert "hˈʌndɹɪd" in written(text)
    assert "hˈʌndɹɪd" not in normalized(text)
    assert normalized(text) == normalized(
        "Call four one five, five five five, zero one two "
        "three, it costs twenty-nine dollars and ninety-nine cents."
    )
    # the other languages keep their readers' own rules either way
    assert _REAL.choose("es", "", text, normalize="off")[1] is _REAL.choose("es", "", text)[1]


def test_the_japanese_share_counts_a_kanji_as_the_chunker_does() -> None:
    assert g2p.japanese_share("ab東") == pytest.approx(2.5 / 4.5)  # CJK_CHAR_WEIGHT letters
    assert g2p.japanese_share("abc") == 0.0
    assert g2p.japanese_share("、。 123") == 0.0
