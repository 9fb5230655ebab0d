"""Split a phoneme string into pieces the model accepts, pure.

Kokoro takes at most 510 phoneme tokens per call. Every sentence becomes its own segment (so a
long text streams sentence by sentence), or, with `pack`, sentences are packed into as few
segments as the limit allows (one engine call costs less per phoneme the longer it is); a
sentence over the limit is cut at clause punctuation, then between words, and only a single
"word" longer than the limit is cut inside. Nothing is ever dropped: the segments joined with
spaces give back the input up to whitespace.
"""

from __future__ import annotations

import re

MAX_PHONEMES = 510

_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+")
_CLAUSE_END = re.compile(r"(?<=[,;:—…])\s+")
_SPACE = re.compile(r"\s+")


def split_phonemes(phonemes: str, max_len: int = MAX_PHONEMES, pack: bool = False) -> list[str]:
    if max_len < 1:
        raise ValueError("max_len must be positive")
    segments: list[str] = []
    for sentence in _SENTENCE_END.split(phonemes.strip()):
        if not sentence:
            continue
        for part in _fit(sentence, max_len, (_CLAUSE_END, _SPACE)):
            if pack and segments and len(segments[-1]) + 1 + len(part) <= max_len:
                segments[-1] = f"{segments[-1]} {part}"
            else:
                segments.append(part)
    return segments


def _fit(text: str, max_len: int, separators: tuple[re.Pattern[str], ...]) -> list[str]:
    if len(text) <= max_len:
        return [text]
    if not separators:
        return [text[i : i + max_len] for i in range(0, len(text), max_len)]
    merged: list[str] = []
    current = ""
    for piece in separators[0].split(text):
        for part in _fit(piece, max_len, separators[1:]):
            candidate = f"{current} {part}" if current else part
            if len(candidate) <= max_len:
                current = candidate
            else:
                merged.append(current)
                current = part
    if current:
        merged.append(current)
    return merged
