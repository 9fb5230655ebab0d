"""Which word of the text each phoneme voices, pure (given a G2P): the map word timings are
read through.

A *word* is a whitespace-separated piece of the text as its sender spelled it ("$29.99,"
keeps its comma in `text`, its spelling), or several such pieces when one normalisation reads
them together ("10:30 a.m.", "$2.5 million": `normalize_spans` says so). Pieces with nothing to
voice (a lone "—") are no word. Each word is phonemized on its own, by the same G2P (so with
the same normalisation) that phonemized the whole text, and those phonemes are lined up with
the whole text's, which are what the model voices (a word's phonemes alone can differ from the
same word's in context, in stress mostly): word for word when both have as many
space-separated phoneme words, which is the rule, else character by character (difflib).

A word's phonemes run from its first to its last voiced character: punctuation (the comma in
"sˈɛnts,") and the spaces between words belong to no word, so their pauses fall between words.
"""

from __future__ import annotations

import difflib
import logging
import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from model_server.text.normalize import normalize_spans

log = logging.getLogger(__name__)

_PIECE = re.compile(r"\S+")


@dataclass(frozen=True)
class WordMap:
    """The words of a text and the phonemes that voice them.

    `spans[k]` is the half-open range of `phonemes` (the whole text's, as the G2P gave them)
    from word k's first voiced character to its last; spans are in order and never overlap."""

    phonemes: str
    words: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]


def voiced(char: str) -> bool:
    """Whether a phoneme character is part of a word: not a space, not punctuation."""
    return not char.isspace() and not unicodedata.category(char).startswith("P")


def word_pieces(text: str) -> list[tuple[int, int]]:
    """The spans of `text`'s words: its whitespace-separated pieces, those that one
    normalisation reads together joined into one."""
    pieces = [m.span() for m in _PIECE.finditer(text)]
    if len(pieces) < 2:
        return pieces
    joined = [False] * (len(pieces) - 1)  # joined[i]: piece i and piece i + 1 are one word
    _, spans = normalize_spans(text)
    for start, end in set(spans):
        if end - start < 2:
            continue
        inside = [i for i, (a, b) in enumerate(pieces) if a < end and b > start]
        for i in inside[:-1]:
            joined[i] = True
    words = [pieces[0]]
    for i, piece in enumerate(pieces[1:]):
        words[-1:] = [(words[-1][0], piece[1])] if joined[i] else [words[-1], piece]
    return words


def map_words(text: str, phonemes: str, g2p: Callable[[str], str]) -> WordMap:
    """The words of `text` and their spans in `phonemes` (what `g2p(text)` gave): its
    white-space pieces (`word_pieces`), or, for a G2P that says where a text's words are (a
    `words(text)` method: Japanese and Mandarin, written without spaces), its words."""
    cut = getattr(g2p, "words", None)
    pieces = cut(text) if cut is not None and not text.isascii() else word_pieces(text)
    per_word = [_phonemize(g2p, text[a:b]) for a, b in pieces]
    labels = _label(phonemes, per_word)
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (char, k) in enumerate(zip(phonemes, labels, strict=True)):
        if k >= 0 and voiced(char):
            first.setdefault(k, i)
            last[k] = i
    order = sorted(first)  # labels rise along the phonemes, so spans come in order
    return WordMap(
        phonemes,
        tuple(text[pieces[k][0] : pieces[k][1]] for k in order),
        tuple((first[k], last[k] + 1) for k in order),
    )


def _phonemize(g2p: Callable[[str], str], word: str) -> str:
    try:
        return g2p(word)
    except Exception:  # the whole text was read: a word alone that cannot be is lined up anyway
        log.debug("G2P failed on a word alone; it is lined up by its neighbours")
        return ""


def _label(phonemes: str, per_word: Sequence[str]) -> list[int]:
    """For every character of `phonemes`, the index of the word it voices, -1 for none."""
    whole = list(_PIECE.finditer(phonemes))
    parts = [(k, m.group()) for k, ps in enumerate(per_word) for m in _PIECE.finditer(ps)]
    labels = [-1] * len(phonemes)
    if len(whole) == len(parts):  # word for word
        for m, (k, _) in zip(whole, parts, strict=True):
            labels[m.start() : m.end()] = [k] * (m.end() - m.start())
        return labels
    # character by character: the words' phonemes, joined, lined up with the whole text's
    joined = " ".join(part for _, part in parts)
    owners: list[int] = []
    for k, part in parts:
        owners.extend([k] * len(part) + [-1])
    for i, j, n in _matching_blocks(phonemes, joined):
        for t in range(n):
            if not phonemes[i + t].isspace():
                labels[i + t] = owners[j + t]
    # a phoneme word partly matched: its unmatched characters take their neighbours' word
    for m in whole:
        known = [labels[i] for i in range(m.start(), m.end()) if labels[i] >= 0]
        fill = known[0] if known else -1
        for i in range(m.start(), m.end()):
            if labels[i] < 0:
                labels[i] = fill
            else:
                fill = labels[i]
    # one not matched at all, between words with a word missing between them: that word
    for n, m in enumerate(whole):
        if labels[m.start()] >= 0:
            continue
        before = max((labels[w.end() - 1] for w in whole[:n]), default=-1)
        after = next((labels[w.start()] for w in whole[n + 1 :] if labels[w.start()] >= 0), None)
        if (len(per_word) if after is None else after) - before >= 2:
            labels[m.start() : m.end()] = [before + 1] * (m.end() - m.start())
    return labels


_WINDOW = 160


def _matching_blocks(a: str, b: str) -> list[tuple[int, int, int]]:
    """difflib's matching blocks of two nearly equal strings, found window by window: the
    strings differ only here and there (stress, a reduced vowel, words run together), and
    difflib on whole texts of thousands of characters takes seconds. Blocks that start in the
    first half of both windows are kept; the next windows start where they end."""
    blocks = []
    i = j = 0
    while i < len(a) and j < len(b):
        last = i + _WINDOW >= len(a) and j + _WINDOW >= len(b)
        matcher = difflib.SequenceMatcher(
            None, a[i : i + _WINDOW], b[j : j + _WINDOW], autojunk=False
        )
        next_i, next_j = i, j
        for x, y, n in matcher.get_matching_blocks():
            if n == 0 or (not last and (x >= _WINDOW // 2 or y >= _WINDOW // 2)):
                break
            blocks.append((i + x, j + y, n))
            next_i, next_j = i + x + n, j + y + n
        if (next_i, next_j) == (i, j):  # nothing in common here: skip half a window
            next_i, next_j = i + _WINDOW // 2, j + _WINDOW // 2
        if last:
            break
        i, j = next_i, next_j
    return blocks
