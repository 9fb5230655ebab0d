"""How long a text takes to speak, estimated, pure: what bounds a reply's cost by what it says
rather than by its characters (the gateway's `--max-reply-audio-s`).

Kokoro speaks the text its model server has normalised (`model_server/text/normalize.py`):
numbers become words, so a character of digits can cost ten of prose. The estimate counts the
characters the normalised text would have, without normalising (the gateway does not import
the model server): a run of digits by its length, a few symbols by the words they become,
a Japanese or Chinese character as 2.5 (`scripts.CJK_CHAR_WEIGHT`: a kana is a syllable),
everything else as itself; then seconds per character of prose. Calibrated once with the real
model on prose, on numbers and on runs of digits, each timed by the audio it spoke
(docs/measured.md, "2026-12-06: how long a text takes to speak"). `SpokenMeter` gives the same
estimate for text that streams in, piece by piece.
"""

from __future__ import annotations

from kokoro_contract.scripts import CJK_CHAR_WEIGHT, is_cjk

S_PER_CHAR = 0.065  # seconds per character of (normalised) text at speed 1
# the characters of a number of n digits (1-15) in words, the mean over random numbers of that
# length through the model server's normaliser ("4821": "four thousand, eight hundred and
# twenty-one"); longer runs are read digit by digit, each digit's name and a space
NUMBER_CHARS = (0, 4, 10, 26, 38, 45, 62, 74, 80, 97, 109, 115, 131, 144, 150, 167)
SPELLED_DIGIT_CHARS = 5.1
MAX_WORDS_DIGITS = 15  # the normaliser's MAX_SPOKEN_DIGITS
# symbols read as words: "50%" is "fifty percent", "$5" "five dollars", "&" "and"
SYMBOL_CHARS = {"%": 8, "$": 8, "€": 6, "£": 7, "&": 4, "@": 3, "+": 5, "=": 7, "#": 6}


def digits_chars(run: int) -> float:
    """The normalised characters of a run of `run` digits."""
    if run <= MAX_WORDS_DIGITS:
        return NUMBER_CHARS[run]
    return SPELLED_DIGIT_CHARS * run


class SpokenMeter:
    """The estimated seconds of speech of text pushed piece by piece: after the same text, the
    same as `spoken_s` of all of it (a run of digits split across pieces counts as one)."""

    def __init__(self, speed: float = 1.0) -> None:
        self.speed = speed
        self._chars = 0.0  # of the text before the trailing run of digits
        self._run = 0  # digits at the end of the text so far

    def push(self, text: str) -> float:
        """Take `text`; the estimate of everything so far."""
        for ch in text:
            if "0" <= ch <= "9":
                self._run += 1
                continue
            if self._run:
                self._chars += digits_chars(self._run)
                self._run = 0
            self._chars += SYMBOL_CHARS.get(ch) or (CJK_CHAR_WEIGHT if is_cjk(ch) else 1)
        return self.seconds

    @property
    def seconds(self) -> float:
        chars = self._chars + (digits_chars(self._run) if self._run else 0.0)
        return chars * S_PER_CHAR / self.speed


def spoken_s(text: str, speed: float = 1.0) -> float:
    """Estimated seconds of speech of `text` at `speed`."""
    return SpokenMeter(speed).push(text)
