"""English text normalisation before G2P, pure: currency, times, percentages, ordinals, years,
decimals and common abbreviations become words, so they read naturally and leave no stray
periods that would look like sentence ends. Numbers longer than anyone reads as an amount are
read digit by digit, so any number reads (num2words names nothing from 10**306 on, and `int()`
refuses more than 4,300 digits)."""

from __future__ import annotations

import re
from collections.abc import Callable

from num2words import num2words

_ABBREVIATIONS = {
    "Dr.": "Doctor",
    "Mr.": "Mister",
    "Mrs.": "Missus",
    "Ms.": "Miz",
    "Prof.": "Professor",
    "Sr.": "Senior",
    "Jr.": "Junior",
    "vs.": "versus",
    "etc.": "et cetera",
    "e.g.": "for example",
    "i.e.": "that is",
    "approx.": "approximately",
    "Inc.": "Incorporated",
    "Ltd.": "Limited",
    "Co.": "Company",
    "No.": "number",
    "Mt.": "Mount",
    "Ave.": "Avenue",
    "Jan.": "January",
    "Feb.": "February",
    "Aug.": "August",
    "Sept.": "September",
    "Oct.": "October",
    "Nov.": "November",
    "Dec.": "December",
}
_ABBR_RE = re.compile(
    r"(?<![\w.])("
    + "|".join(re.escape(a) for a in sorted(_ABBREVIATIONS, key=len, reverse=True))
    + r")(?=\s|$|[,;:!?)])"
)
# "U.S.", "U.K.", "A.I.": spell the letters.
_INITIALISM_RE = re.compile(r"(?<![\w.])((?:[A-Za-z]\.){2,})(?=\W|$)")
_NO_NUMBER_RE = re.compile(r"\bNo\.\s?(?=\d)")

_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
}
_SCALES = r"thousand|million|billion|trillion"
_GROUPED = r"\d{1,3}(?:,\d{3})+"  # "1,234,567"
_CURRENCY_RE = re.compile(
    r"([$€£])\s?(" + _GROUPED + r"|\d+)(?:\.(\d{1,2}))?(?:\s?(" + _SCALES + r"|[kKmMbB])\b)?"
)
_SCALE_LETTERS = {"k": "thousand", "m": "million", "b": "billion"}
_TIME_RE = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)(?:\s?([AaPp])(\.[Mm]\.|[Mm])(?=\W|$))?")
# (?<!\d): a match starts where the number does; without it a long digit run costs n**2 steps
_PERCENT_RE = re.compile(r"(?<!\d)(\d+(?:\.\d+)?)\s?%")
_ORDINAL_RE = re.compile(r"\b(" + _GROUPED + r"|\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_DECIMAL_RE = re.compile(r"(?<![\d.])(" + _GROUPED + r"|\d+)\.(\d+)(?![\d.]*\d\.)")
_VERSION_RE = re.compile(r"\b\d+(?:\.\d+){2,}\b")
_NUMBER_RE = re.compile(r"(?<![\d.])(" + _GROUPED + r"|\d+)(?![\d])")


# Longer numbers are read digit by digit: a plain run of more than 15 digits (past the
# trillions) is an identifier more often than an amount; one grouped with commas is an amount,
# named in words up to the decillions.
MAX_SPOKEN_DIGITS = 15
MAX_GROUPED_DIGITS = 36
_DIGIT_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")

_TITLES = frozenset({"Dr.", "Mr.", "Mrs.", "Ms.", "Prof.", "Mt.", "No."})


def _abbreviation(m: re.Match[str]) -> str:
    abbr = m.group(1)
    word = _ABBREVIATIONS[abbr]
    # "... and so on, etc." ends a sentence; a title never does.
    return word + "." if abbr not in _TITLES and _ends_sentence(m) else word


def _ends_sentence(m: re.Match[str]) -> bool:
    """Whether the dot that closed an abbreviation also closed its sentence."""
    rest = m.string[m.end() :]
    return not rest.strip() or re.match(r"\s+[A-Z]", rest) is not None


def _initialism(m: re.Match[str]) -> str:
    spoken = " ".join(m.group(1).replace(".", ""))
    return spoken + "." if _ends_sentence(m) else spoken


def _words(n: int, to: str = "cardinal") -> str:
    return str(num2words(n, to=to, lang="en"))


def _digits(raw: str) -> str:
    """The ASCII digits of a number as written: "1,234" -> "1234" (any Unicode digits too)."""
    return "".join(str(int(c)) for c in raw if c != ",")


def _spell(digits: str) -> str:
    """Digit by digit: "042" -> "zero four two"."""
    return " ".join(_DIGIT_NAMES[int(d)] for d in digits)


def _in_words(raw: str, digits: str) -> bool:
    """Whether a number as written ("1234", "1,234") is short enough to be read in words."""
    return len(digits) <= (MAX_GROUPED_DIGITS if "," in raw else MAX_SPOKEN_DIGITS)


def _cardinal(raw: str) -> str:
    digits = _digits(raw)
    return _words(int(digits)) if _in_words(raw, digits) else _spell(digits)


def _ordinal(raw: str) -> str:
    """An ordinal: "1,000th" -> "one thousandth"; a long one digit by digit, the last as one."""
    digits = _digits(raw)
    if _in_words(raw, digits):
        return _words(int(digits), to="ordinal")
    return f"{_spell(digits[:-1])} {_words(int(digits[-1]), to='ordinal')}"


def _point(whole: str, frac: str) -> str:
    """A decimal: the whole part as a number, the fraction digit by digit."""
    return f"{_cardinal(whole)} point {_spell(_digits(frac))}"


def _currency(m: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCIES[m.group(1)]
    whole, frac, scale = m.group(2), m.group(3), m.group(4)
    if scale:
        scale_word = _SCALE_LETTERS.get(scale.lower(), scale.lower())
        frac = (frac or "").rstrip("0")  # "$2.50 million": two point five
        number = _point(whole, frac) if frac else _cardinal(whole)
        return f"{number} {scale_word} {many}"
    units = _digits(whole).lstrip("0")  # "" for none
    parts = []
    if units or not frac:
        parts.append(f"{_cardinal(whole)} {one if units == '1' else many}")
    if frac:
        cents = int(frac.ljust(2, "0"))
        if cents:
            parts.append(f"{_words(cents)} {sub_one if cents == 1 else sub_many}")
    return " and ".join(parts)


def _time(m: re.Match[str]) -> str:
    hour, minute, meridiem = int(m.group(1)), int(m.group(2)), m.group(3)
    if minute == 0:
        spoken = f"{_words(hour)} o'clock" if not meridiem else _words(hour)
    elif minute < 10:
        spoken = f"{_words(hour)} oh {_words(minute)}"
    else:
        spoken = f"{_words(hour)} {_words(minute)}"
    if meridiem:
        # capitals, read as letters ("a m" would read as the article "uh" and "em")
        spoken += " AM" if meridiem.lower() == "a" else " PM"
        if m.group(4).endswith(".") and _ends_sentence(m):
            spoken += "."
    return spoken


def _decimal(m: re.Match[str]) -> str:
    return _point(m.group(1), m.group(2))


def _version(m: re.Match[str]) -> str:
    return " point ".join(_cardinal(p) for p in m.group(0).split("."))


def _number(m: re.Match[str]) -> str:
    raw = m.group(1)
    if "," not in raw and len(raw) == 4 and 1100 <= int(raw) <= 2099:
        return _words(int(raw), to="year")
    return _cardinal(raw)


_RULES: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (_NO_NUMBER_RE, "number "),
    (_ABBR_RE, _abbreviation),
    (_TIME_RE, _time),
    (_INITIALISM_RE, _initialism),
    (_CURRENCY_RE, _currency),
    (_PERCENT_RE, lambda m: f"{m.group(1)} percent"),
    (_ORDINAL_RE, lambda m: _ordinal(m.group(1))),
    (_VERSION_RE, _version),
    (_DECIMAL_RE, _decimal),
    (_NUMBER_RE, _number),
]


_SPACES = re.compile(r"[ \t]+")


def normalize(text: str) -> str:
    """Rewrite what G2P would read badly into plain words. Idempotent on plain prose."""
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return _SPACES.sub(" ", text).strip()


Span = tuple[int, int]


def normalize_spans(text: str) -> tuple[str, list[Span]]:
    """`normalize(text)`, and where each of its characters came from: the span of `text` it
    reads (a character a rule wrote reads the whole match: every character of "twenty-nine
    dollars" reads "$29")."""
    spans = [(i, i + 1) for i in range(len(text))]
    for pattern, repl in _RULES:
        text, spans = _sub_spans(pattern, repl, text, spans)
    text, spans = _sub_spans(_SPACES, " ", text, spans)
    start, end = len(text) - len(text.lstrip()), len(text.rstrip())
    return text[start:end], spans[start:end]


def _sub_spans(
    pattern: re.Pattern[str],
    repl: str | Callable[[re.Match[str]], str],
    text: str,
    spans: list[Span],
) -> tuple[str, list[Span]]:
    """`pattern.sub(repl, text)` with the spans carried along."""
    out: list[str] = []
    out_spans: list[Span] = []
    pos = 0
    for m in pattern.finditer(text):
        out.append(text[pos : m.start()])
        out_spans.extend(spans[pos : m.start()])
        new = m.expand(repl) if isinstance(repl, str) else repl(m)
        covered = spans[m.start() : m.end()]
        if covered:
            span = (min(s for s, _ in covered), max(e for _, e in covered))
        else:  # an empty match reads nothing: it sits where it is
            at = spans[m.start()][0] if m.start() < len(spans) else (spans[-1][1] if spans else 0)
            span = (at, at)
        out.append(new)
        out_spans.extend([span] * len(new))
        pos = m.end()
    out.append(text[pos:])
    out_spans.extend(spans[pos:])
    return "".join(out), out_spans
