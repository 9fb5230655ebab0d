"""Speech markup, pure, for both sides: what a text asks for beyond its words.

Three forms, under a request's `markup` option (`MARKUP`):

- inline pronunciation, `[Kokoro](/kˈOkəɹO/)`: the written word, said with the given IPA;
- inline pauses, `[pause:1.5s]` or `[pause:500ms]`: silence of that length;
- an SSML subset, when the text starts with `<speak>`: `<break time|strength>`,
  `<prosody rate>`, `<phoneme alphabet="ipa" ph>`, `<sub alias>`, `<say-as interpret-as>`, and
  `<p>`/`<s>` (read as their text), parsed by expat (a real XML parser: no document types, no
  entities beyond XML's own).

`auto` (the default) takes what parses and reads the rest as text: an inline link whose target
is not IPA (a markdown link such as `[docs](/docs/)`: plain ASCII letters) is read as its text,
so what an LLM writes is never an error. `strict` answers what does not parse as
`invalid_markup` (or `invalid_ipa` naming the symbol), `none` reads everything as text.

`parse` gives a text's `Item`s: `Words` to read as text, `Said` for a written word said another
way (IPA, an alias, an SSML interpretation), `Pause`. The model server reads them; the gateway's
chunker uses `protected` never to cut inside a construct and `SsmlFrames` to make every chunk of
an SSML reply a document of its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any
from xml.parsers import expat

from kokoro_contract import limits
from kokoro_contract.errors import InvalidRequest

MARKUP = ("auto", "strict", "none")
# the symbols Kokoro-82M's vocabulary has (its config's `vocab`; the model server checks against
# the one it loads, tests/kokoro_contract/test_markup.py that they are the same): what IPA in
# markup or a lexicon may use
PHONEMES = frozenset(
    ' !"(),.:;?AIOQSTWYabcdefhijklmnopqrstuvwxyzæçðøŋœɐɑɒɔɕɖəɚɛɜɟɡɣɤɥɨɪɯɰɲɳɴɸɹɻɽɾʁʂʃʈʊʋʌʎʒʔ'
    "ʝʣʤʥʦʧʨʰʲˈˌː\u0303βθχᵊᵝᵻ—“”…→↓↗↘ꭧ"
)
DEFAULT_MAX_PAUSE_S = 10.0
# one text's pauses together, in its longest pauses: a text of many pauses is no flood of silence
PAUSES_PER_TEXT = 6
# an inline construct or SSML tag still open this many characters after it began is not held
# any longer: the chunker cuts as if it were text (and `strict` answers it as invalid)
HOLD_CHARS = 256
# what `<break strength>` means, in seconds (SSML leaves it to the engine)
STRENGTHS = {
    "none": 0.0,
    "x-weak": 0.1,
    "weak": 0.25,
    "medium": 0.5,
    "strong": 0.75,
    "x-strong": 1.0,
}
RATES = {"x-slow": 0.6, "slow": 0.8, "medium": 1.0, "fast": 1.25, "x-fast": 1.5}
SAY_AS = (
    "characters",
    "spell-out",
    "cardinal",
    "ordinal",
    "digits",
    "telephone",
    "date",
    "time",
)
# elements that hold one word's reading: never cut inside one
INLINE_ELEMENTS = frozenset({"phoneme", "sub", "say-as"})
_ELEMENTS = frozenset({"speak", "break", "prosody", "p", "s"}) | INLINE_ELEMENTS

_SECONDS = r"\s*([0-9]*\.?[0-9]+)\s*(ms|s)\s*"  # a pause's length: 1.5s, 500ms
_PAUSE = re.compile(r"\[pause:" + _SECONDS + r"\]", re.IGNORECASE)
_DURATION = re.compile(_SECONDS, re.IGNORECASE)
_PERCENT = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*%\s*")


def check_markup(value: object) -> str:
    return limits.check_choice(value, "markup", MARKUP)


@dataclass(frozen=True)
class Words:
    """Text read as the G2P reads it, at `rate` times the request's speed."""

    text: str
    rate: float = 1.0


@dataclass(frozen=True)
class Said:
    """A written word (or phrase) said another way: with `ipa`, as those phonemes; with
    `alias`, as that text; with `say_as`, as that SSML interpretation of `written`. Its word
    timing is the written word's."""

    written: str
    ipa: str | None = None
    alias: str | None = None
    say_as: str | None = None
    rate: float = 1.0


@dataclass(frozen=True)
class Pause:
    """Silence of `seconds`."""

    seconds: float


Item = Words | Said | Pause


def plain(text: str) -> tuple[Item, ...]:
    return (Words(text),) if text.strip() else ()


def is_ssml(text: str) -> bool:
    return text.lstrip().startswith("<speak")


def parse(
    text: str,
    mode: str = "auto",
    symbols: Collection[str] | None = None,
    max_pause_s: float = DEFAULT_MAX_PAUSE_S,
) -> tuple[Item, ...]:
    """`text`'s items under `mode`. `symbols`: the phonemes the model knows (IPA with others is
    `invalid_ipa` under `strict`, text under `auto`); None checks none. `InvalidRequest`:
    `invalid_markup`, `invalid_ipa` (under `strict`), `pause_too_long` (a pause over
    `max_pause_s`, or pauses over `PAUSES_PER_TEXT` times that together, in any mode but
    `none`)."""
    if mode == "none":
        return plain(text)
    if is_ssml(text):
        items = _Ssml(mode == "strict", symbols, max_pause_s).parse(text)
    else:
        items = tuple(_merge(_inline(text, mode == "strict", symbols, max_pause_s)))
    total = sum(item.seconds for item in items if isinstance(item, Pause))
    if total > PAUSES_PER_TEXT * max_pause_s:
        raise InvalidRequest(
            f"pauses of {total:g} s in all; one text may pause {PAUSES_PER_TEXT * max_pause_s:g} "
            "s at most",
            code="pause_too_long",
        )
    return items


def spoken_text(items: tuple[Item, ...]) -> str:
    """What the items say, written: for choosing a language and for logs."""
    return " ".join(
        item.text if isinstance(item, Words) else item.written
        for item in items
        if not isinstance(item, Pause)
    )


# --- inline --------------------------------------------------------------------------------


def _inline(
    text: str, strict: bool, symbols: Collection[str] | None, max_pause_s: float
) -> Iterator[Item]:
    at = 0
    i = text.find("[")
    while i >= 0:
        found = _construct(text, i, strict, symbols, max_pause_s)
        if found is None:
            i = text.find("[", i + 1)
            continue
        end, item = found
        if i > at:
            yield Words(text[at:i])
        yield item
        at = end
        i = text.find("[", end)
    if at < len(text):
        yield Words(text[at:])


def _construct(
    text: str, i: int, strict: bool, symbols: Collection[str] | None, max_pause_s: float
) -> tuple[int, Item] | None:
    """The inline construct at `text[i] == "["`: where it ends and what it is; None when
    there is none (text, under `auto`)."""
    close = text.find("]", i)
    if text[i + 1 : i + 7].lower() == "pause:":
        m = _PAUSE.match(text, i)
        if m is None:
            if strict:
                raise InvalidRequest(
                    f"a pause at character {i} is not [pause:<number>s] or [pause:<number>ms]",
                    code="invalid_markup",
                )
            return None
        return m.end(), Pause(_seconds(m.group(1), m.group(2), max_pause_s))
    if close < 0 or text[close + 1 : close + 3] != "(/":
        return None
    end = text.find("/)", close + 3)
    if end < 0:
        if strict:
            raise InvalidRequest(
                f"the pronunciation at character {i} has no closing '/)'", code="invalid_markup"
            )
        return None
    written, ipa = text[i + 1 : close], text[close + 3 : end]
    if not written.strip() or "[" in written:
        return None
    if not strict and (ipa.isascii() or _unknown(ipa, symbols) is not None):
        # a markdown link (or IPA the model cannot say): its text is what is read
        return end + 2, Words(written)
    where = f"the pronunciation at character {i}"
    return end + 2, Said(written.strip(), ipa=check_ipa(ipa, symbols, where))


def check_ipa(ipa: str, symbols: Collection[str] | None, where: str) -> str:
    """`ipa` stripped; `invalid_ipa` naming `where` when it is empty or has a symbol not in
    `symbols` (None: any symbol)."""
    ipa = ipa.strip()
    if not ipa:
        raise InvalidRequest(f"{where} is empty", code="invalid_ipa")
    unknown = _unknown(ipa, symbols)
    if unknown is not None:
        raise InvalidRequest(
            f"{where} has {unknown!r} (U+{ord(unknown):04X}), which is not one of the "
            "model's phonemes",
            code="invalid_ipa",
        )
    return ipa


def _unknown(ipa: str, symbols: Collection[str] | None) -> str | None:
    if symbols is None:
        return None
    return next((c for c in ipa if c != " " and c not in symbols), None)


def _seconds(number: str, unit: str, max_pause_s: float) -> float:
    seconds = float(number) / (1000 if unit.lower() == "ms" else 1)
    if not math.isfinite(seconds) or seconds > max_pause_s:
        raise InvalidRequest(
            f"a pause of {seconds:g} s is longer than the {max_pause_s:g} s allowed",
            code="pause_too_long",
        )
    return seconds


def _merge(items: Iterator[Item]) -> Iterator[Item]:
    """Adjacent text of one rate as one `Words`; nothing empty. White space between constructs
    stays (it says whether their words are apart); at either end it goes."""
    out: list[Item] = []
    for item in items:
        if isinstance(item, Words):
            if not item.text:
                continue
            last = out[-1] if out else None
            if isinstance(last, Words) and last.rate == item.rate:
                out[-1] = Words(last.text + item.text, item.rate)
                continue
        out.append(item)
    while out and isinstance(out[0], Words) and not out[0].text.strip():
        out.pop(0)
    while out and isinstance(out[-1], Words) and not out[-1].text.strip():
        out.pop()
    yield from out


# --- SSML ----------------------------------------------------------------------------------


@dataclass
class _Open:
    name: str
    rate: float
    said: dict[str, str] = field(default_factory=dict)  # an inline element's reading
    text: str = ""  # an inline element's written text


class _Ssml:
    """One SSML document to items, through expat's events."""

    def __init__(self, strict: bool, symbols: Collection[str] | None, max_pause_s: float):
        self.strict = strict
        self.symbols = symbols
        self.max_pause_s = max_pause_s
        self.items: list[Item] = []
        self.stack: list[_Open] = []
        self.parser = expat.ParserCreate()
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.parser.CharacterDataHandler = self._text
        self.parser.StartDoctypeDeclHandler = self._doctype
        self.parser.EntityDeclHandler = self._doctype

    def parse(self, text: str) -> tuple[Item, ...]:
        try:
            self.parser.Parse(text, True)
        except expat.ExpatError as exc:
            if self.strict:
                raise InvalidRequest(
                    f"the SSML does not parse: {expat.ErrorString(exc.code)} at line "
                    f"{exc.lineno}, column {exc.offset}",
                    code="invalid_markup",
                ) from None
            return plain(_text_of(text))
        return tuple(_merge(iter(self.items)))

    @property
    def rate(self) -> float:
        return self.stack[-1].rate if self.stack else 1.0

    def _where(self) -> str:
        return f"line {self.parser.CurrentLineNumber}, column {self.parser.CurrentColumnNumber}"

    def _invalid(self, message: str, code: str = "invalid_markup") -> None:
        if self.strict:
            raise InvalidRequest(f"{message} at {self._where()}", code=code)

    def _doctype(self, *_: Any) -> None:
        raise InvalidRequest(
            "SSML may not declare a document type or entities", code="invalid_markup"
        )

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        rate = self.rate
        if not self.stack and name != "speak":
            self._invalid(f"the root element is <{name}>, not <speak>")
        if self.stack and self.stack[-1].name in INLINE_ELEMENTS:
            self._invalid(f"<{name}> inside <{self.stack[-1].name}>")
        if name not in _ELEMENTS:
            self._invalid(f"<{name}> is not supported")
        elif name == "break":
            self.items.append(Pause(self._break(attrs)))
        elif name == "prosody" and "rate" in attrs:
            rate *= self._rate(attrs["rate"])
        open_ = _Open(name, rate)
        if name in INLINE_ELEMENTS:
            open_.said = self._reading(name, attrs)
        self.stack.append(open_)

    def _end(self, name: str) -> None:
        open_ = self.stack.pop()
        if name in ("p", "s") and self.items:  # a paragraph or sentence ends: a pause mark
            self.items.append(Words(" ", open_.rate))
        if not open_.said:
            if name in INLINE_ELEMENTS and open_.text.strip():  # a reading it could not take
                self.items.append(Words(open_.text, open_.rate))
            return
        written = " ".join(open_.text.split())
        if not written and "alias" not in open_.said and "ipa" not in open_.said:
            self._invalid(f"<{name}> has no text")
            return
        self.items.append(
            Said(written or open_.said.get("alias", ""), rate=open_.rate, **open_.said)
        )

    def _text(self, data: str) -> None:
        if not self.stack:
            return
        if self.stack[-1].name in INLINE_ELEMENTS:
            self.stack[-1].text += data
        else:
            self.items.append(Words(data, self.rate))

    def _break(self, attrs: dict[str, str]) -> float:
        if "time" in attrs:
            m = _DURATION.fullmatch(attrs["time"])
            if m is None:
                self._invalid(f"<break time={attrs['time']!r}> is not a number of s or ms")
                return STRENGTHS["medium"]
            return _seconds(m.group(1), m.group(2), self.max_pause_s)
        strength = attrs.get("strength", "medium")
        if strength not in STRENGTHS:
            self._invalid(f"<break strength={strength!r}> is not one of {', '.join(STRENGTHS)}")
            return STRENGTHS["medium"]
        return STRENGTHS[strength]

    def _rate(self, value: str) -> float:
        if value in RATES:
            return RATES[value]
        m = _PERCENT.fullmatch(value)
        if m is not None and float(m.group(1)) > 0:
            return float(m.group(1)) / 100
        self._invalid(f"<prosody rate={value!r}> is not a percentage or one of {', '.join(RATES)}")
        return 1.0

    def _reading(self, name: str, attrs: dict[str, str]) -> dict[str, str]:
        """An inline element's reading (`Said`'s fields), or none it can take."""
        if name == "phoneme":
            if attrs.get("alphabet", "ipa") != "ipa" or "ph" not in attrs:
                self._invalid('<phoneme> needs alphabet="ipa" and ph')
                return {}
            ipa = attrs["ph"]
            unknown = _unknown(ipa, self.symbols)
            if unknown is not None or not ipa.strip():
                if self.strict:
                    check_ipa(ipa, self.symbols, f"the <phoneme> at {self._where()}")
                return {}
            return {"ipa": ipa.strip()}
        if name == "sub":
            if not attrs.get("alias", "").strip():
                self._invalid("<sub> needs an alias")
                return {}
            return {"alias": attrs["alias"]}
        kind = attrs.get("interpret-as", "")
        if kind not in SAY_AS:
            self._invalid(f"<say-as interpret-as={kind!r}> is not one of {', '.join(SAY_AS)}")
            return {}
        return {"say_as": kind}


def _text_of(ssml: str) -> str:
    """An SSML text that does not parse, read as text: its tags are not said."""
    out, depth = [], 0
    for c in ssml:
        if c == "<":
            depth += 1
        elif c == ">" and depth:
            depth -= 1
        elif not depth:
            out.append(c)
    return "".join(out)


# --- cutting streamed markup (the gateway's chunker) -------------------------------------------


@dataclass(frozen=True)
class Tag:
    """An SSML tag's place in a text: `text[start:end]`, its element's name, and whether it
    opens, closes or is empty (`<break/>`)."""

    start: int
    end: int
    name: str
    kind: str  # "open", "close" or "empty"


def tags(text: str) -> Iterator[Tag | int]:
    """The tags of an SSML text in order, each whole; an int where one starts and does not end
    within the text (the text is still arriving). Quoted attribute values may hold `>`."""
    i = text.find("<")
    while i >= 0:
        quote = ""
        j = i + 1
        while j < len(text):
            c = text[j]
            if quote:
                quote = "" if c == quote else quote
            elif c in "\"'":
                quote = c
            elif c == ">":
                break
            j += 1
        if j >= len(text):
            yield i
            return
        body = text[i + 1 : j]
        kind = "close" if body.startswith("/") else "empty" if body.endswith("/") else "open"
        name = body.lstrip("/").rstrip("/").split(None, 1)[0] if body.strip("/ ") else ""
        yield Tag(i, j + 1, name, kind)
        i = text.find("<", j + 1)


def protected(text: str, ssml: bool) -> tuple[list[tuple[int, int]], int | None]:
    """Where a chunk may not be cut: the spans of `text`'s whole constructs (a cut strictly
    inside one is not allowed), and where an unfinished one starts (nothing from there on can
    be cut until more text comes), None when none is, or when it began `HOLD_CHARS` or more
    before the end (then it is text)."""
    spans: list[tuple[int, int]] = []
    held: int | None = None

    def hold(start: int) -> None:
        nonlocal held
        if held is None and len(text) - start < HOLD_CHARS:
            held = start

    if ssml:
        inline: Tag | None = None  # an inline element's open tag, until its close tag
        for tag in tags(text):
            if isinstance(tag, int):
                hold(inline.start if inline is not None else tag)
                break
            if inline is not None:
                if tag.kind == "close" and tag.name == inline.name:
                    spans.append((inline.start, tag.end))
                    inline = None
                continue
            if tag.kind == "open" and tag.name in INLINE_ELEMENTS:
                inline = tag
            else:
                spans.append((tag.start, tag.end))
        else:
            if inline is not None:
                hold(inline.start)
        for m in re.finditer(r"&[#\w]{0,12}", text):  # entities: "&amp;" is one character
            if m.end() < len(text) and text[m.end()] == ";":
                spans.append((m.start(), m.end() + 1))
            elif m.end() == len(text):
                hold(m.start())
        return sorted(spans), held
    i = text.find("[")
    while i >= 0:
        end = _inline_end(text, i)
        if end is None:
            i = text.find("[", i + 1)
            continue
        if end < 0:
            hold(i)
            break
        spans.append((i, end))
        i = text.find("[", end)
    return spans, held


def _inline_end(text: str, i: int) -> int | None:
    """Past the inline construct at `text[i] == "["`; -1 when one may be unfinished there,
    None when there is none."""
    close = text.find("]", i)
    if close < 0:
        return -1 if "\n" not in text[i:] else None
    if text[i + 1 : i + 7].lower() == "pause:":
        return close + 1
    after = text[close + 1 : close + 3]
    if after == "(/":
        end = text.find("/)", close + 3)
        return -1 if end < 0 else end + 2
    return -1 if "(/".startswith(after) and close + 3 > len(text) else None


def inside(spans: list[tuple[int, int]], cut: int) -> bool:
    return any(start < cut < end for start, end in spans)


class SsmlFrames:
    """Each chunk of an SSML reply as a document of its own: the elements open where it starts
    (`<speak>`, a `<prosody>`) opened again before it, those open where it ends closed after
    it. Chunks come in order, never cut inside a tag or an inline element (`protected`)."""

    def __init__(self) -> None:
        self._open: list[Tag] = []
        self._raw: list[str] = []

    def frame(self, chunk: str) -> str:
        before = "".join(self._raw)
        for tag in tags(chunk):
            if isinstance(tag, int):
                break
            if tag.kind == "open":
                self._open.append(tag)
                self._raw.append(chunk[tag.start : tag.end])
            elif tag.kind == "close" and self._open and self._open[-1].name == tag.name:
                self._open.pop()
                self._raw.pop()
        after = "".join(f"</{tag.name}>" for tag in reversed(self._open))
        return before + chunk + after
