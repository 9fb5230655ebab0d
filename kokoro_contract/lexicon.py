"""Pronunciation lexicons, pure, for both sides: word -> IPA (written between slashes,
`"/kˈOkəɹO/"`) or word -> alias text (`"sequel"`), applied before G2P.

A key is a word or a phrase (letters, digits and `' - . &` between spaces). Case: a key written
all in lower case matches the word in any case ("kokoro" matches "Kokoro" and "KOKORO"); a key
with a capital matches that spelling only ("SQL" matches "SQL", never "sql"). A key matches whole
words only, the longest key first where two could; what it matches is said as the entry says and
timed as written (`markup.Said`).

The gateway keeps lexicons (a deployment's `--lexicon-file`, each API key's `PUT
/v1/lexicons/{name}`), each a `Lexicon` that a new version replaces, so a reply uses one
version from start to end; with each chunk it sends the model server the entries that chunk
uses (`Lexicon.used`), which the model server applies to the chunk's text (`apply`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property

from kokoro_contract.errors import InvalidRequest
from kokoro_contract.markup import PHONEMES, Item, Said, Words, check_ipa

MAX_ENTRIES = 10_000  # in one lexicon
MAX_REQUEST_ENTRIES = 1_000  # sent with one synthesis request
MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 256
_KEY = re.compile(r"[^\W_](?:[\w'&.\- ]*[^\W_])?\.?")


@dataclass(frozen=True)
class Lexicon:
    """One version of a lexicon: `entries` word -> reading (checked: `check_entries`)."""

    name: str
    entries: Mapping[str, str]
    version: int = 1

    @cached_property
    def _pattern(self) -> re.Pattern[str] | None:
        return pattern(self.entries)

    def used(self, text: str) -> dict[str, str]:
        """The entries `text` uses."""
        return {key: self.entries[key] for _, key in _found(self._pattern, self.entries, text)}

    def merged(self, over: Lexicon | None) -> Lexicon:
        """This lexicon with `over`'s entries on top (theirs win), at `over`'s version."""
        if over is None:
            return self
        return Lexicon(f"{self.name}+{over.name}", {**self.entries, **over.entries}, over.version)


def check_entries(
    obj: object, max_entries: int = MAX_ENTRIES, symbols: Iterable[str] = PHONEMES
) -> dict[str, str]:
    """A lexicon's entries as sent (a JSON object word -> reading). `InvalidRequest`:
    `lexicon_too_large` past `max_entries`, `invalid_lexicon` for a key or value that is not
    one (naming it), `invalid_ipa` for IPA with a symbol the model lacks."""
    if not isinstance(obj, dict):
        raise InvalidRequest(
            "a lexicon is a JSON object of word -> IPA ('/.../') or alias text",
            code="invalid_lexicon",
        )
    if len(obj) > max_entries:
        raise InvalidRequest(
            f"a lexicon of {len(obj)} entries; the most is {max_entries}", code="lexicon_too_large"
        )
    known = frozenset(symbols)
    entries: dict[str, str] = {}
    for key, value in obj.items():
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS or not _KEY.fullmatch(key):
            raise InvalidRequest(
                f"lexicon key {str(key)[:MAX_KEY_CHARS]!r}: a word or phrase of up to "
                f"{MAX_KEY_CHARS} letters, digits and ' & . -",
                code="invalid_lexicon",
            )
        if not isinstance(value, str) or not value.strip() or len(value) > MAX_VALUE_CHARS:
            raise InvalidRequest(
                f"lexicon entry {key!r}: IPA between slashes or alias text, 1-{MAX_VALUE_CHARS} "
                "characters",
                code="invalid_lexicon",
            )
        if is_ipa(value):
            check_ipa(value.strip()[1:-1], known, f"lexicon entry {key!r}")
        entries[key] = value.strip()
    return entries


def is_ipa(reading: str) -> bool:
    reading = reading.strip()
    return len(reading) >= 2 and reading.startswith("/") and reading.endswith("/")


def pattern(entries: Iterable[str]) -> re.Pattern[str] | None:
    """One pattern matching every key as whole words, the longest first."""
    keys = sorted(entries, key=len, reverse=True)
    if not keys:
        return None
    alternatives = "|".join(re.escape(key) for key in keys)
    return re.compile(rf"(?<!\w)(?:{alternatives})(?!\w)", re.IGNORECASE)


def _found(
    compiled: re.Pattern[str] | None, entries: Mapping[str, str], text: str
) -> Iterator[tuple[re.Match[str], str]]:
    """Where `text` has a key's words, and which key, by the case rule."""
    if compiled is None:
        return
    lower = {key.lower(): key for key in entries if key == key.lower()}
    for m in compiled.finditer(text):
        word = m.group(0)
        key = word if word in entries else lower.get(word.lower())
        if key is not None:
            yield m, key


def apply(items: Iterable[Item], entries: Mapping[str, str]) -> tuple[Item, ...]:
    """`items` with every word a lexicon entry matches in their text said as it says."""
    compiled = pattern(entries)
    if compiled is None:
        return tuple(items)
    out: list[Item] = []
    for item in items:
        if not isinstance(item, Words):
            out.append(item)
            continue
        at = 0
        for m, key in _found(compiled, entries, item.text):
            word = m.group(0)
            if m.start() > at:
                out.append(Words(item.text[at : m.start()], item.rate))
            reading = entries[key]
            if is_ipa(reading):
                out.append(Said(word, ipa=reading.strip()[1:-1].strip(), rate=item.rate))
            else:
                out.append(Said(word, alias=reading, rate=item.rate))
            at = m.end()
        if at < len(item.text):
            out.append(Words(item.text[at:], item.rate))
    return tuple(out)
