"""English text normalisation before G2P, pure: currency, times, percentages, ordinals, years,
decimals and common abbreviations become words, so they read naturally and leave no stray
periods that would look like sentence ends."""

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
_CURRENCY_RE = re.compile(
    r"([$€£])\s?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?(?:\s?(" + _SCALES + r"|[kKmMbB])\b)?"
)
_SCALE_LETTERS = {"k": "thousand", "m": "million", "b": "billion"}
_TIME_RE = re.compile(r"\b([01]?\d|2[0-3]):([0-5]\d)(?:\s?([AaPp])(\.[Mm]\.|[Mm])(?=\W|$))?")
_PERCENT_RE = re.compile(r"(\d+(?:\.\d+)?)\s?%")
_ORDINAL_RE = re.compile(r"\b(\d+)(st|nd|rd|th)\b", re.IGNORECASE)
_DECIMAL_RE = re.compile(r"(?<![\d.])(\d+)\.(\d+)(?![\d.]*\d\.)")
_VERSION_RE = re.compile(r"\b\d+(?:\.\d+){2,}\b")
_NUMBER_RE = re.compile(r"(?<![\d.])(\d{1,3}(?:,\d{3})+|\d+)(?![\d])")


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


def _words(n: int | float, to: str = "cardinal") -> str:
    return str(num2words(n, to=to, lang="en"))


def _int(digits: str) -> int:
    return int(digits.replace(",", ""))


def _currency(m: re.Match[str]) -> str:
    one, many, sub_one, sub_many = _CURRENCIES[m.group(1)]
    whole, frac, scale = _int(m.group(2)), m.group(3), m.group(4)
    if scale:
        scale_word = _SCALE_LETTERS.get(scale.lower(), scale.lower())
        amount = f"{whole}.{frac}" if frac else str(whole)
        number = _words(float(amount)) if frac else _words(whole)
        return f"{number} {scale_word} {many}"
    parts = []
    if whole or not frac:
        parts.append(f"{_words(whole)} {one if whole == 1 else many}")
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
    digits = " ".join(_words(int(d)) for d in m.group(2))
    return f"{_words(_int(m.group(1)))} point {digits}"


def _version(m: re.Match[str]) -> str:
    return " point ".join(_words(int(p)) for p in m.group(0).split("."))


def _number(m: re.Match[str]) -> str:
    raw = m.group(1)
    value = _int(raw)
    if "," not in raw and len(raw) == 4 and 1100 <= value <= 2099:
        return _words(value, to="year")
    return _words(value)


_RULES: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
    (_NO_NUMBER_RE, "number "),
    (_ABBR_RE, _abbreviation),
    (_TIME_RE, _time),
    (_INITIALISM_RE, _initialism),
    (_CURRENCY_RE, _currency),
    (_PERCENT_RE, lambda m: f"{m.group(1)} percent"),
    (_ORDINAL_RE, lambda m: _words(int(m.group(1)), to="ordinal")),
    (_VERSION_RE, _version),
    (_DECIMAL_RE, _decimal),
    (_NUMBER_RE, _number),
]


def normalize(text: str) -> str:
    """Rewrite what G2P would read badly into plain words. Idempotent on plain prose."""
    for pattern, repl in _RULES:
        text = pattern.sub(repl, text)
    return re.sub(r"[ \t]+", " ", text).strip()
