"""Request limits and validation: the one owner of what a request may ask for.

Every route of both services checks text, speed, voice and ids here (the gateway's pydantic
models read the same constants), so a limit is defined once. Each check returns the clean
value or raises `InvalidRequest` with a stable code.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection

from kokoro_contract import blends
from kokoro_contract.errors import InvalidRequest

MIN_SPEED = 0.5
MAX_SPEED = 2.0
DEFAULT_SPEED = 1.0
MAX_TEXT_CHARS = 5_000  # the default of both services' --max-text-chars
MAX_REQUEST_ID_CHARS = 128
MAX_UTTERANCE_ID_CHARS = 64
MAX_DEADLINE_MS = 600_000.0
MAX_PLAYED_MS = 3_600_000.0  # a cancel's played_ms: an hour of audio
MIN_KEY_CHARS = 16  # an API key of either service (the gateway's keys, the model server's)
# ASCII only: the id goes into a response header (X-Utterance-Id) and SSE event ids
UTTERANCE_ID_PATTERN = r"^[A-Za-z0-9_.:-]+$"
_UTTERANCE_ID = re.compile(UTTERANCE_ID_PATTERN)


def check_text(text: object, max_chars: int = MAX_TEXT_CHARS, what: str = "text") -> str:
    if text is None:
        raise InvalidRequest(f"field '{what}' is required", code="missing_text")
    if not isinstance(text, str):
        raise InvalidRequest(f"field '{what}' must be a string", code="invalid_field")
    if not text.strip():
        raise InvalidRequest(f"field '{what}' is empty", code="empty_text")
    if len(text) > max_chars:
        raise InvalidRequest(
            f"{what} has {len(text)} characters; the limit is {max_chars}", code="text_too_long"
        )
    return text


def check_speed(speed: object) -> float:
    if speed is None:
        return DEFAULT_SPEED
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not math.isfinite(speed):
        raise InvalidRequest("field 'speed' must be a number", code="invalid_speed")
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise InvalidRequest(
            f"speed {speed} is out of range [{MIN_SPEED}, {MAX_SPEED}]", code="invalid_speed"
        )
    return float(speed)


def check_voice(voice: object, voices: Collection[str], default: str) -> str:
    """A loaded voice, or a blend of loaded voices (`blends.check_blend`: its canonical name);
    none (or "") means the default."""
    if voice is None or voice == "":
        return default
    if isinstance(voice, list) and not (voice and all(isinstance(p, str) for p in voice)):
        raise InvalidRequest(
            "field 'voice' must be a string, or a blend's voice names as a list",
            code="invalid_field",
        )
    if blends.is_blend(voice):
        return blends.check_blend(voice, voices)
    if not isinstance(voice, str):
        raise InvalidRequest("field 'voice' must be a string", code="invalid_field")
    if voice not in voices:
        known = ", ".join(sorted(voices))
        raise InvalidRequest(
            f"unknown voice {voice!r}; loaded voices: {known}", code="unknown_voice"
        )
    return voice


def check_request_id(rid: object) -> str | None:
    if rid is None:
        return None
    if (
        not isinstance(rid, str)
        or not rid
        or len(rid) > MAX_REQUEST_ID_CHARS
        or not (rid.isascii() and rid.isprintable())  # it may go into a header
        or rid != rid.strip()  # which would trim it: the echo would differ
    ):
        raise InvalidRequest(
            f"request_id must be 1-{MAX_REQUEST_ID_CHARS} printable ASCII characters, without "
            "spaces at either end",
            code="invalid_field",
        )
    return rid


def check_utterance_id(value: object, what: str) -> str:
    """An id of the utterance kind (an utterance's, a context's, a Twilio stream's): 1-64
    characters of `UTTERANCE_ID_PATTERN`, safe in headers and frames."""
    if (
        not isinstance(value, str)
        or not 0 < len(value) <= MAX_UTTERANCE_ID_CHARS
        or not _UTTERANCE_ID.match(value)
    ):
        raise InvalidRequest(
            f"'{what}' is 1-{MAX_UTTERANCE_ID_CHARS} characters of [A-Za-z0-9_.:-]",
            code="invalid_field",
        )
    return value


def check_flag(value: object, name: str) -> bool:
    """An optional boolean field; absent means false."""
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidRequest(f"field '{name}' must be true or false", code="invalid_field")
    return value


def check_choice(value: object, name: str, choices: tuple[str, ...]) -> str:
    """An optional field that is one of `choices`; absent means the first."""
    if value is None:
        return choices[0]
    if value not in choices:
        raise InvalidRequest(
            f"field '{name}' must be one of {', '.join(choices)}", code="invalid_field"
        )
    return str(value)


def check_deadline_ms(deadline: object) -> float | None:
    """Milliseconds from a request's arrival by which its first audio is needed; None: as soon
    as possible."""
    if deadline is None:
        return None
    if (
        isinstance(deadline, bool)
        or not isinstance(deadline, int | float)
        or not math.isfinite(deadline)
        or not 0 <= deadline <= MAX_DEADLINE_MS
    ):
        raise InvalidRequest(
            f"deadline_ms must be a number of milliseconds in [0, {MAX_DEADLINE_MS:.0f}]",
            code="invalid_field",
        )
    return float(deadline)
