"""Word error rate, pure: (substitutions + deletions + insertions) / reference words, after
both sides are reduced to lowercase words (punctuation dropped, apostrophes and hyphens inside
words kept as one word, "twenty-nine" and "twenty nine" made equal)."""

from __future__ import annotations

import re
from dataclasses import dataclass

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)*")


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower().replace("-", " "))


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    """Levenshtein distance over words (unit costs)."""
    previous = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        current = [i]
        for j, h in enumerate(hyp, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (r != h)))
        previous = current
    return previous[-1]


@dataclass(frozen=True)
class WordErrors:
    errors: int
    words: int

    @property
    def rate(self) -> float:
        return self.errors / self.words if self.words else 0.0

    def __add__(self, other: WordErrors) -> WordErrors:
        return WordErrors(self.errors + other.errors, self.words + other.words)


def word_errors(reference: str, hypothesis: str) -> WordErrors:
    ref = words(reference)
    return WordErrors(edit_distance(ref, words(hypothesis)), len(ref))


def total(parts: list[WordErrors]) -> WordErrors:
    """Corpus-level rate: errors and words summed, not rates averaged."""
    return sum(parts, WordErrors(0, 0))
