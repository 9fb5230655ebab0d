"""English text normalisation before G2P, pure: what an agent's answers are full of becomes
words, read as a person would read it aloud: e-mail addresses and web addresses ("jane dot doe at
example dot com"), phone numbers (E.164 and national forms, digit by digit in their groups),
dates, order codes and reference numbers (letters and digits one by one), units, money in several
currencies (by symbol or ISO code), times, percentages, ordinals, years, decimals and common
abbreviations; and they leave no stray periods that would look like sentence ends. Numbers
longer than anyone reads as an amount are read digit by digit, so any number reads (num2words
names nothing from 10**306 on, and `int()` refuses more than 4,300 digits)."""

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

Money = tuple[str, str, str | None, str | None]  # one, many, and the hundredth's (if any)
_CURRENCIES: dict[str, Money] = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", None, None),
    "₹": ("rupee", "rupees", "paisa", "paise"),
    "₩": ("won", "won", None, None),
}
_CODES: dict[str, Money] = {
    "USD": ("US dollar", "US dollars", "cent", "cents"),
    "EUR": _CURRENCIES["€"],
    "GBP": _CURRENCIES["£"],
    "JPY": _CURRENCIES["¥"],
    "INR": _CURRENCIES["₹"],
    "CAD": ("Canadian dollar", "Canadian dollars", "cent", "cents"),
    "AUD": ("Australian dollar", "Australian dollars", "cent", "cents"),
    "CHF": ("Swiss franc", "Swiss francs", "centime", "centimes"),
    "CNY": ("yuan", "yuan", "fen", "fen"),
    "MXN": ("Mexican peso", "Mexican pesos", "centavo", "centavos"),
}
_SCALES = r"thousand|million|billion|trillion"
_GROUPED = r"\d{1,3}(?:,\d{3})+"  # "1,234,567"
_AMOUNT = r"(" + _GROUPED + r"|\d+)(?:\.(\d{1,2}))?(?:\s?(" + _SCALES + r"|[kKmMbB])\b)?"
_CURRENCY_RE = re.compile(r"([$€£¥₹₩])\s?" + _AMOUNT)
_CODE_NAMES = "|".join(_CODES)
_CODE_BEFORE_RE = re.compile(r"\b(" + _CODE_NAMES + r")\s?" + _AMOUNT)
_CODE_AFTER_RE = re.compile(
    r"(?<![\d.,])(" + _GROUPED + r"|\d+)(?:\.(\d{1,2}))?\s?(" + _CODE_NAMES + r")\b"
)

# web and e-mail addresses: the top-level domains a bare one ("example.com") is known by; with
# a scheme any host is one
_TLDS = (
    "com|org|net|edu|gov|io|ai|dev|app|co|us|uk|de|fr|es|it|nl|jp|cn|in|ca|au|br|mx|ch|se|no|"
    "info|biz|me|tv|ly|shop|store|cloud|tech"
)
_EMAIL_RE = re.compile(r"(?<![\w.+-])([\w.+-]+)@([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+)(?<!\.)")
_URL_RE = re.compile(
    r"(?<![\w@./-])(?:(https?://)([A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)"
    r"|((?:www\.)?[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.(?:" + _TLDS + r")))"
    r"(?![\w-])(:\d+)?((?:/[\w\-.~%?=&#+]*[\w~%=#+])*/?)"
)
_URL_SYMBOLS = {
    ".": "dot",
    "/": "slash",
    "-": "dash",
    "_": "underscore",
    "?": "question mark",
    "=": "equals",
    "&": "and",
    "#": "hash",
    "%": "percent",
    "~": "tilde",
    "+": "plus",
    ":": "colon",
    "@": "at",
}
# phone numbers: "+" and a country code then groups, or three or more groups joined by "-" or
# "." or after a bracketed area code, or a local "555-0199" (spaces alone join amounts as often:
# "between 100 200"); 7 to 15 digits in all
_PHONE_RE = re.compile(
    r"(?<![\w+.,-])(?:\+\d{1,3}(?:[ .-]?\(?\d{1,4}\)?)(?:[ .-]?\d{2,4}){1,4}|\+\d{7,15}"
    r"|\(\d{2,4}\)[ .-]?\d{2,4}(?:[ .-]\d{2,4}){0,3}|\d{1,4}(?:[.-]\d{2,4}){2,4}|\d{3}-\d{4})"
    r"(?![\w-]|[.,]\d)"
)
# dates: ISO (2025-03-07), American (3/7/2025, 03-07-2025), and a month's name with its day
# (March 7)
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]
_ISO_DATE_RE = re.compile(r"(?<![\w-])(\d{4})-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])(?![\w-])")
_SLASH_DATE_RE = re.compile(
    r"(?<![\w/-])(0?[1-9]|1[0-2])([/-])(0?[1-9]|[12]\d|3[01])\2(\d{4}|\d{2})(?![\w/-])"
)
_MONTH_DAY_RE = re.compile(
    r"\b(" + "|".join(_MONTHS) + r")\s+(0?[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?\b(?![:.]\d)"
)
# order codes and references: capitals and digits mixed, five or more in all ("ORD-48213",
# "7GH3K2"), and "#48213"
_CODE_RE = re.compile(
    r"(?<![\w-])(?=(?:[A-Z-]*\d){2})(?=[\d-]*[A-Z])(?=(?:-?[A-Z0-9]){5})"
    r"[A-Z0-9]+(?:-[A-Z0-9]+)*(?![\w-])"
)
_HASH_NUMBER_RE = re.compile(r"(?<![\w&])#(\d+)\b")
# units after a number: the abbreviation and its words, one and many
_UNITS: dict[str, tuple[str, str]] = {
    "km/h": ("kilometer per hour", "kilometers per hour"),
    "mph": ("mile per hour", "miles per hour"),
    "kWh": ("kilowatt hour", "kilowatt hours"),
    "km": ("kilometer", "kilometers"),
    "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"),
    "kg": ("kilogram", "kilograms"),
    "mg": ("milligram", "milligrams"),
    "lbs": ("pound", "pounds"),
    "lb": ("pound", "pounds"),
    "oz": ("ounce", "ounces"),
    "mi": ("mile", "miles"),
    "ft": ("foot", "feet"),
    "ml": ("milliliter", "milliliters"),
    "mL": ("milliliter", "milliliters"),
    "TB": ("terabyte", "terabytes"),
    "GB": ("gigabyte", "gigabytes"),
    "MB": ("megabyte", "megabytes"),
    "KB": ("kilobyte", "kilobytes"),
    "GHz": ("gigahertz", "gigahertz"),
    "MHz": ("megahertz", "megahertz"),
    "kW": ("kilowatt", "kilowatts"),
    "ms": ("millisecond", "milliseconds"),
    "hrs": ("hour", "hours"),
    "hr": ("hour", "hours"),
    "mins": ("minute", "minutes"),
    "min": ("minute", "minutes"),
    "secs": ("second", "seconds"),
    "sec": ("second", "seconds"),
    "°C": ("degree Celsius", "degrees Celsius"),
    "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
}
_UNIT_RE = re.compile(
    r"(?<![\w.,])("
    + _GROUPED
    + r"|\d+)(?:\.(\d+))?\s?("
    + "|".join(re.escape(u) for u in sorted(_UNITS, key=len, reverse=True))
    + r")(?![\w/])"
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
    spoken = _letters(m.group(1).replace(".", "").upper())
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
    return _money(_CURRENCIES[m.group(1)], m.group(2), m.group(3), m.group(4))


def _code_before(m: re.Match[str]) -> str:
    return _money(_CODES[m.group(1)], m.group(2), m.group(3), m.group(4))


def _code_after(m: re.Match[str]) -> str:
    return _money(_CODES[m.group(3)], m.group(1), m.group(2), None)


def _money(names: Money, whole: str, frac: str | None, scale: str | None) -> str:
    """An amount in words: "29.99" dollars is "twenty-nine dollars and ninety-nine cents", a
    currency with no hundredths says its fraction as a decimal ("1.5" yen)."""
    one, many, sub_one, sub_many = names
    if frac and sub_one is None:
        scale = scale or ""
    if scale is not None:
        scale_word = _SCALE_LETTERS.get(scale.lower(), scale.lower())
        frac = (frac or "").rstrip("0")  # "$2.50 million": two point five
        number = _point(whole, frac) if frac else _cardinal(whole)
        return " ".join(w for w in (number, scale_word, many) if w)
    units = _digits(whole).lstrip("0")  # "" for none
    parts = []
    if units or not frac:
        parts.append(f"{_cardinal(whole)} {one if units == '1' else many}")
    if frac:
        cents = int(frac.ljust(2, "0"))
        if cents:
            parts.append(f"{_words(cents)} {sub_one if cents == 1 else sub_many}")
    return " and ".join(parts)


def _spoken_symbols(text: str) -> str:
    """An address's pieces: its words as words, its digits one by one, its symbols by name
    ("orders/1042?x=1": "orders slash one zero four two question mark x equals one")."""
    words = []
    for piece in re.findall(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]", text):
        if piece.isdigit():
            words.append(_spell(piece))
        elif piece.isalpha():
            words.append(piece)
        elif piece in _URL_SYMBOLS:
            words.append(_URL_SYMBOLS[piece])
    return " ".join(words)


def _email(m: re.Match[str]) -> str:
    return f"{_spoken_symbols(m.group(1))} at {_spoken_symbols(m.group(2))}"


def _url(m: re.Match[str]) -> str:
    """A web address as read aloud: no scheme, "w w w dot" kept, the rest piece by piece (a
    lone trailing slash unsaid)."""
    host = m.group(2) or m.group(3)
    spoken = host.replace("www.", "w w w.", 1) if host.startswith("www.") else host
    port, path = m.group(4) or "", m.group(5).rstrip("/")
    return _spoken_symbols(spoken + port + path)


def _phone(m: re.Match[str]) -> str:
    """Digit by digit, a pause between its groups: "+1 (415) 555-0123" is "plus one, four one
    five, five five five, zero one two three"."""
    raw = m.group(0)
    digits = sum(c.isdigit() for c in raw)
    return _telephone(raw) if 7 <= digits <= 15 else raw


def _telephone(raw: str) -> str:
    """A number's digit groups spelled, a pause between them, "plus" for a leading "+"
    ("+14155550123", one group: the digits alone)."""
    spoken = ", ".join(_spell(g) for g in re.findall(r"\d+", raw))
    return "plus " + spoken if raw.startswith("+") else spoken


def _date(month: int, day: int, year: str | None) -> str:
    spoken = f"{_MONTHS[month - 1]} {_words(day, to='ordinal')}"
    if year is None:
        return spoken
    return f"{spoken}, {_words(int(year), to='year') if len(year) == 4 else _words(int(year))}"


def _iso_date(m: re.Match[str]) -> str:
    return _date(int(m.group(2)), int(m.group(3)), m.group(1))


def _slash_date(m: re.Match[str]) -> str:
    return _date(int(m.group(1)), int(m.group(3)), m.group(4))


def _month_day(m: re.Match[str]) -> str:
    return _date(_MONTHS.index(m.group(1)) + 1, int(m.group(2)), None)


def _letters(text: str) -> str:
    """Capitals said one by one, "A" as the letter (a lone "A" reads as the article)."""
    return " ".join("eh" if c == "A" else c for c in text)


def _code(m: re.Match[str]) -> str:
    """A reference, letters and digits one by one: "ORD-4821" is "O R D four eight two one"."""
    pieces = re.findall(r"[A-Z]+|\d+", m.group(0))
    return " ".join(_spell(p) if p.isdigit() else _letters(p) for p in pieces)


def _unit(m: re.Match[str]) -> str:
    one, many = _UNITS[m.group(3)]
    whole, frac = m.group(1), m.group(2)
    number = _point(whole, frac) if frac else _cardinal(whole)
    return f"{number} {one if not frac and _digits(whole) == '1' else many}"


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
    (_EMAIL_RE, _email),
    (_URL_RE, _url),
    (_ISO_DATE_RE, _iso_date),
    (_SLASH_DATE_RE, _slash_date),
    (_PHONE_RE, _phone),
    (_HASH_NUMBER_RE, lambda m: f"number {_spell(m.group(1))}"),
    (_CODE_RE, _code),
    (_NO_NUMBER_RE, "number "),
    (_ABBR_RE, _abbreviation),
    (_MONTH_DAY_RE, _month_day),
    (_TIME_RE, _time),
    (_INITIALISM_RE, _initialism),
    (_CURRENCY_RE, _currency),
    (_CODE_BEFORE_RE, _code_before),
    (_CODE_AFTER_RE, _code_after),
    (_UNIT_RE, _unit),
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


def say_as(kind: str, text: str) -> str:
    """`text` read as SSML's `<say-as interpret-as=kind>` asks (`kokoro_contract.markup.SAY_AS`):
    "characters"/"spell-out" letter by letter ("AB1" -> "eh B one"), "digits" digit by digit,
    "cardinal" and "ordinal" as numbers, "telephone", "date" and "time" by this module's readers
    for them; what it cannot read that way is normalised as any text is."""
    raw = text.strip()
    number = re.fullmatch(r"(" + _GROUPED + r"|\d+)(?:st|nd|rd|th)?", raw, re.IGNORECASE)
    if kind in ("characters", "spell-out"):
        return " ".join(
            _spell(c) if c in "0123456789" else _letters(c.upper()) for c in raw if c.isalnum()
        )
    if kind == "digits" and any(c.isdigit() for c in raw):
        return _spell(_digits("".join(c for c in raw if c.isdigit())))
    if kind in ("cardinal", "ordinal") and number is not None:
        return _cardinal(number.group(1)) if kind == "cardinal" else _ordinal(number.group(1))
    if kind == "telephone" and sum(c.isdigit() for c in raw) >= 3:
        return _telephone(raw)
    return normalize(raw)
