"""English grapheme-to-phoneme conversion into Kokoro's phoneme set, offline.

misaki's lexicon G2P (gold/silver dictionaries, spaCy tagging) is used when spaCy's
`en_core_web_sm` model happens to be installed; otherwise misaki's espeak path, with the espeak-ng
library and data shipped by `espeakng-loader` (no system espeak). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
from dataclasses import dataclass
from typing import Protocol

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
