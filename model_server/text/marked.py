"""A marked-up text's items (`kokoro_contract.markup`) as what the engine voices, pure (given a
G2P): *parts*, each a run of phonemes at one rate with the silence asked before it, and, with
word timings, each part's word map.

Text is phonemized run by run between the constructs (`Words` by the G2P, as a plain text is);
a `Said` word is its IPA as given, or its alias (or SSML interpretation, `say_as`) read by the
G2P, and is one word in the word map, timed as written. A plain text is one part, the same
phonemes and word map as without markup."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kokoro_contract.markup import Item, Pause, Said, Words
from model_server.text.normalize import say_as
from model_server.text.words import WordMap, map_words, voiced

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Part:
    """Phonemes voiced at `rate` times the request's speed, after `pause_s` seconds of silence;
    `words` its word map (with timestamps)."""

    phonemes: str
    words: WordMap | None
    rate: float = 1.0
    pause_s: float = 0.0


@dataclass(frozen=True)
class Reading:
    """A text's parts, and the silence asked after the last one."""

    parts: tuple[Part, ...]
    pause_after_s: float = 0.0

    @property
    def phonemes(self) -> str:
        return " ".join(part.phonemes for part in self.parts)


def read(items: Sequence[Item], g2p: Callable[[str], str], timestamps: bool) -> Reading:
    """`items` as parts: a new part at each pause and each change of rate."""
    parts: list[Part] = []
    run: list[tuple[str, WordMap]] = []  # each piece's phonemes, after a space or none
    rate, pause = 1.0, 0.0
    apart = False  # whether white space comes before the next piece

    def close() -> None:
        nonlocal run, pause
        words = join_maps([w for _, w in run], [sep for sep, _ in run])
        if words.phonemes.strip():
            parts.append(Part(words.phonemes, words if timestamps else None, rate, pause))
            pause = 0.0
        run = []

    for item in items:
        if isinstance(item, Pause):
            close()
            pause += item.seconds
            continue
        if item.rate != rate:
            close()
            rate = item.rate
        if isinstance(item, Words):
            apart = apart or item.text[:1].isspace()
            phonemes = g2p(item.text).strip()
            words = _map(item.text, phonemes, g2p) if timestamps else WordMap(phonemes, (), ())
        else:
            phonemes = said(item, g2p)
            words = WordMap(phonemes, (item.written,), _whole(phonemes))
        if phonemes:
            run.append((" " if apart and run else "", words))
            apart = False
        if isinstance(item, Words):
            apart = item.text[-1:].isspace() or (apart and not phonemes)
    close()
    return Reading(tuple(parts), pause)


def _map(text: str, phonemes: str, g2p: Callable[[str], str]) -> WordMap:
    try:
        return map_words(text, phonemes, g2p)
    except Exception:  # timings are an aid: the audio goes out, with no words
        log.exception("word map failed on %d characters", len(text))
        return WordMap(phonemes, (), ())


def said(item: Said, g2p: Callable[[str], str]) -> str:
    """A `Said` word's phonemes."""
    if item.ipa is not None:
        return item.ipa.strip()
    text = item.alias if item.alias is not None else say_as(item.say_as or "", item.written)
    return g2p(text).strip()


def _whole(phonemes: str) -> tuple[tuple[int, int], ...]:
    """One word over all of `phonemes`' voiced characters."""
    marks = [i for i, c in enumerate(phonemes) if voiced(c)]
    return ((marks[0], marks[-1] + 1),) if marks else ()


def join_maps(maps: Sequence[WordMap | None], seps: Sequence[str] | None = None) -> WordMap:
    """Word maps of phoneme runs, as one of the runs joined: each after its separator in
    `seps` (default: a space between each two)."""
    phonemes = ""
    words: list[str] = []
    spans: list[tuple[int, int]] = []
    for i, m in enumerate(maps):
        if m is None:
            continue
        sep = seps[i] if seps is not None else (" " if phonemes else "")
        phonemes += sep
        at = len(phonemes)
        phonemes += m.phonemes
        words.extend(m.words)
        spans.extend((a + at, b + at) for a, b in m.spans)
    return WordMap(phonemes, tuple(words), tuple(spans))
