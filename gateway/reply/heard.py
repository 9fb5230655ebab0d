"""What a listener heard of an utterance they interrupted, pure: its word timings and text in,
the text up to the last word that had finished playing out.

A word counts as heard when its end is at or before `played_ms`; a word cut in the middle was
not heard. The answer is the utterance's own text, as it was spelled ("$29.99", not "twenty-nine
dollars ..."), up to the end of that word, so punctuation between heard words stays.
"""

from __future__ import annotations

from collections.abc import Sequence

from kokoro_contract.protocol import WordTiming


def heard_words(words: Sequence[WordTiming], played_ms: float) -> list[WordTiming]:
    """The words (timed in milliseconds) that had finished by `played_ms`, in order."""
    heard = []
    for word in words:
        if word.end > played_ms:
            break
        heard.append(word)
    return heard


def heard_text(words: Sequence[WordTiming], text: str, played_ms: float) -> str:
    heard = heard_words(words, played_ms)
    if not heard:
        return ""
    end = 0
    for word in heard:
        found = text.find(word.word, end)
        if found < 0:  # the timings spell a word otherwise: say what they say
            return " ".join(w.word for w in heard)
        end = found + len(word.word)
    return text[:end].strip()
