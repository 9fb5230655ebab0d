"""The languages Kokoro-82M speaks, pure, for both sides: how a request names one (Kokoro's
one-letter codes or ISO names), which a voice implies (its first letter, as Kokoro reads it),
and which voice speaks one when none is asked for. The gateway checks a request's `language`
with it before anything is voiced; the model server picks its G2P with it."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from kokoro_contract.errors import InvalidRequest


@dataclass(frozen=True)
class Language:
    code: str  # Kokoro's one letter, the first of its voices' names
    name: str  # the ISO name requests and answers use
    label: str
    espeak: str | None = None  # espeak-ng's voice, for the languages G2P'd through it


LANGUAGES: tuple[Language, ...] = (
    Language("a", "en-us", "American English"),
    Language("b", "en-gb", "British English"),
    Language("j", "ja", "Japanese"),
    Language("z", "zh", "Mandarin Chinese"),
    Language("e", "es", "Spanish", espeak="es"),
    Language("f", "fr", "French", espeak="fr-fr"),
    Language("h", "hi", "Hindi", espeak="hi"),
    Language("i", "it", "Italian", espeak="it"),
    Language("p", "pt-br", "Brazilian Portuguese", espeak="pt-br"),
)
BY_NAME = {language.name: language for language in LANGUAGES}
_BY_CODE = {language.code: language for language in LANGUAGES}
# what else a request may call them: Kokoro's own spellings and the bare language names
_ALIASES = {"en": "en-us", "fr-fr": "fr", "pt": "pt-br", "zh-cn": "zh", "cmn": "zh"}
ENGLISH = BY_NAME["en-us"]


def known() -> str:
    """The names a request may use, for an error that lists them."""
    return ", ".join(f"{language.name} ({language.code})" for language in LANGUAGES)


def lookup(value: str) -> Language | None:
    """The language `value` names (a one-letter code, an ISO name or an alias; any case), or
    None."""
    key = value.strip().lower().replace("_", "-")
    if key in _BY_CODE:
        return _BY_CODE[key]
    return BY_NAME.get(_ALIASES.get(key, key))


def check_language(value: object) -> str | None:
    """A request's `language` as its ISO name; none (or "") means the voice's (`of_voice`).
    `unknown_language` names the ones there are."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise InvalidRequest("field 'language' must be a string", code="invalid_field")
    language = lookup(value)
    if language is None:
        raise InvalidRequest(
            f"unknown language {value[:40]!r}; use one of {known()}", code="unknown_language"
        )
    return language.name


def of_voice(voice: str) -> Language | None:
    """The language a voice's name implies (`ef_dora`: Spanish), as Kokoro reads it; None for
    a name that does not start with one of its letters and an underscore after two."""
    if len(voice) < 3 or voice[2] != "_":
        return None
    return _BY_CODE.get(voice[0].lower())


def voice_for(language: str | None, voices: Collection[str], default: str) -> str:
    """The voice that speaks `language` when a request names none: the default voice when it
    speaks it (or no language is named), else the first loaded voice that does (by name), else
    the default anyway."""
    if language is None or _speaks(default, language):
        return default
    return next((v for v in sorted(voices) if _speaks(v, language)), default)


def _speaks(voice: str, language: str) -> bool:
    implied = of_voice(voice)
    return implied is not None and implied.name == language
