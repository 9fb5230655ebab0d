"""`WS /v1/speak/ws`, the wire format, pure: client frames in, typed messages out; events out as
frames.

client -> server (text frames, JSON):
    {"type": "speak", "text"|"prompt"?, "mode", "format", "voice", "speed", "utterance_id"?}
        without text or prompt, the client streams its own text:
    {"type": "text", "delta": "..."}    more text for the current utterance
    {"type": "flush"}                   no more text for it
    {"type": "cancel", "played_ms"?}    barge-in; played_ms: how much the listener heard
    {"type": "close"}

server -> client: the reply's events as JSON text frames (with "type" and "utterance_id"),
except audio: binary frames of [1 byte: n][n bytes: utterance id, ASCII][whole codec units], so
late audio of a cancelled utterance is recognisable and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import BadRequest
from gateway.params import SpeakParams, parse
from gateway.reply.events import Cancelled, Event, payload
from kokoro_contract.errors import ServiceError
from kokoro_contract.limits import MAX_PLAYED_MS


@dataclass(frozen=True)
class Speak:
    params: SpeakParams


@dataclass(frozen=True)
class Text:
    delta: str


@dataclass(frozen=True)
class Flush:
    pass


@dataclass(frozen=True)
class Cancel:
    played_ms: float | None = None  # how much of the utterance the listener heard


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Invalid:
    """A frame that is not a message the server can act on; answered with an error frame."""

    error: ServiceError


ClientMessage = Speak | Text | Flush | Cancel | Close | Invalid


def parse_client_message(text: str | None) -> ClientMessage:
    """One client frame: its text, or None for a binary frame."""
    if text is None:
        return Invalid(BadRequest("send JSON in text frames", code="binary_frame"))
    try:
        msg = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return Invalid(BadRequest(f"message is not JSON: {exc}", code="invalid_json"))
    if not isinstance(msg, dict):
        return Invalid(BadRequest("message must be a JSON object", code="not_an_object"))
    kind = msg.pop("type", None)
    try:
        match kind:
            case "speak":
                return Speak(parse(SpeakParams, msg))
            case "text":
                delta = msg.get("delta")
                if not isinstance(delta, str):
                    raise BadRequest("'delta' must be a string", code="invalid_field")
                return Text(delta)
            case "flush":
                return Flush()
            case "cancel":
                return Cancel(_played_ms(msg.get("played_ms")))
            case "close":
                return Close()
    except ServiceError as exc:
        return Invalid(exc)
    return Invalid(
        BadRequest(
            f"unknown message type {kind!r}; expected speak, text, flush, cancel or close",
            code="unknown_type",
        )
    )


def _played_ms(value: object) -> float | None:
    if value is None:
        return None
    valid = isinstance(value, int | float) and not isinstance(value, bool)
    if not valid or not 0 <= value <= MAX_PLAYED_MS:  # type: ignore[operator]
        raise BadRequest(
            f"'played_ms' must be a number of milliseconds in [0, {MAX_PLAYED_MS}]",
            code="invalid_field",
        )
    return float(value)  # type: ignore[arg-type]


# --- server -> client ---------------------------------------------------------------------------


def _dump(body: dict[str, Any]) -> str:
    return orjson.dumps(body).decode()


def event_frame(event: Event, utterance_id: str) -> str:
    """A reply's event (not audio: see `audio_frame`) as a text frame."""
    return _dump({"type": event.name, "utterance_id": utterance_id, **payload(event)})


def audio_frame(utterance_id: str, data: bytes) -> bytes:
    uid = utterance_id.encode("ascii")
    return bytes([len(uid)]) + uid + data


def error_frame(error: ServiceError, utterance_id: str | None = None) -> str:
    body: dict[str, Any] = {"type": "error", "code": error.code, "message": error.message}
    body["retryable"] = error.retryable
    body["status"] = error.status  # the HTTP status the gateway's HTTP routes give the code
    if error.retry_after_s is not None:
        body["retry_after_s"] = error.retry_after_s
    if utterance_id:
        body["utterance_id"] = utterance_id
    return _dump(body)


def cancelled_frame(
    utterance_id: str, played_ms: float | None = None, heard_text: str | None = None
) -> str:
    return event_frame(Cancelled(utterance_id, played_ms, heard_text), utterance_id)
