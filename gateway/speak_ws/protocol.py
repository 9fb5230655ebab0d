"""`WS /v1/speak/ws`, the wire format, pure: client frames in, typed messages out; events out as
frames. Two versions: protocol 1 (the default) and protocol 2 (`?protocol=2`).

client -> server, protocol 1 (text frames, JSON):
    {"type": "speak", "text"|"prompt"?, "mode", "format", "voice", "speed", "language"?,
     "normalize"?, "markup"?, "utterance_id"?}
        without text or prompt, the client streams its own text:
    {"type": "text", "delta": "..."}    more text for the current utterance
    {"type": "flush"}                   no more text for it
    {"type": "cancel", "played_ms"?}    barge-in; played_ms: how much the listener heard
    {"type": "close"}

protocol 2: several contexts at once, each message naming its own:
    {"type": "speak", "context_id"?, "buffering"?, ...}   opens a context (the same fields;
        `utterance_id` is accepted for `context_id`; `buffering`: "gateway" or "client")
    {"type": "text", "context_id", "delta"}
    {"type": "flush", "context_id", "flush_id"?}   synthesize what came so far; stays open
    {"type": "close_context", "context_id"}        no more text for it (protocol 1's flush)
    {"type": "cancel", "context_id", "played_ms"?}
    {"type": "close"}

server -> client: the reply's events as JSON text frames (with "type" and "utterance_id"; in
protocol 2 "context_id"), except audio: binary frames of [1 byte: n][n bytes: the id, ASCII]
[whole codec units], so late audio of a cancelled utterance is recognisable and dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import BadRequest
from gateway.params import Buffering, SpeakParams, parse
from gateway.reply.events import Cancelled, Event, payload
from gateway.sources.base import FlushId
from kokoro_contract import limits
from kokoro_contract.errors import ServiceError
from kokoro_contract.limits import MAX_PLAYED_MS

VERSIONS = (1, 2)
UTTERANCE_KEY = "utterance_id"  # what names an utterance in protocol 1's frames
CONTEXT_KEY = "context_id"  # and a context in protocol 2's
MAX_FLUSH_ID_CHARS = 64


@dataclass(frozen=True)
class Speak:
    params: SpeakParams  # protocol 2: its `utterance_id` is the context's id, if given
    buffering: Buffering = Buffering.GATEWAY


@dataclass(frozen=True)
class Text:
    delta: str
    context_id: str | None = None  # protocol 2's: the context it is for


@dataclass(frozen=True)
class Flush:
    """Protocol 1: no more text. Protocol 2: synthesize what came so far; the context stays
    open, and `flush_id` is answered with `flushed` once its audio has been sent."""

    context_id: str | None = None
    flush_id: FlushId | None = None


@dataclass(frozen=True)
class CloseContext:
    """Protocol 2: no more text for the context (protocol 1's `flush`)."""

    context_id: str


@dataclass(frozen=True)
class Cancel:
    played_ms: float | None = None  # how much of the utterance the listener heard
    context_id: str | None = None


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class Invalid:
    """A frame that is not a message the server can act on; answered with an error frame."""

    error: ServiceError


ClientMessage = Speak | Text | Flush | CloseContext | Cancel | Close | Invalid


def parse_client_message(text: str | None, version: int = 1) -> ClientMessage:
    """One client frame: its text, or None for a binary frame; in protocol `version`."""
    if text is None:
        return Invalid(BadRequest("send JSON in text frames", code="binary_frame"))
    try:
        msg = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        return Invalid(BadRequest(f"message is not JSON: {exc}", code="invalid_json"))
    if not isinstance(msg, dict):
        return Invalid(BadRequest("message must be a JSON object", code="not_an_object"))
    return parse_client_object(msg, version)


def parse_client_object(msg: dict[str, Any], version: int = 1) -> ClientMessage:
    """One client message, its JSON object already decoded (taken apart: `type` removed)."""
    kind = msg.pop("type", None)
    try:
        if version == 2:
            return _parse_v2(kind, msg)
        match kind:
            case "speak":
                return Speak(parse(SpeakParams, msg))
            case "text":
                return Text(_delta(msg))
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


def _parse_v2(kind: object, msg: dict[str, Any]) -> ClientMessage:
    match kind:
        case "speak":
            return _speak_v2(msg)
        case "text":
            return Text(_delta(msg), _context_id(msg))
        case "flush":
            return Flush(_context_id(msg), _flush_id(msg.get("flush_id")))
        case "close_context":
            return CloseContext(_context_id(msg))
        case "cancel":
            return Cancel(_played_ms(msg.get("played_ms")), _context_id(msg))
        case "close":
            return Close()
    return Invalid(
        BadRequest(
            f"unknown message type {kind!r}; expected speak, text, flush, close_context, "
            "cancel or close",
            code="unknown_type",
        )
    )


def _speak_v2(msg: dict[str, Any]) -> Speak:
    context_id = msg.pop(CONTEXT_KEY, None)
    if context_id is not None:
        if msg.get(UTTERANCE_KEY, context_id) != context_id:
            raise BadRequest(
                "give 'context_id' or 'utterance_id' (the same id), not two", code="invalid_field"
            )
        msg[UTTERANCE_KEY] = context_id
    buffering = msg.pop("buffering", Buffering.GATEWAY.value)
    try:
        chosen = Buffering(buffering)
    except ValueError:
        raise BadRequest(
            "'buffering' is 'gateway' (the chunk plan cuts the text) or 'client' (each flush)",
            code="invalid_field",
        ) from None
    return Speak(parse(SpeakParams, msg), chosen)


def _delta(msg: dict[str, Any]) -> str:
    delta = msg.get("delta")
    if not isinstance(delta, str):
        raise BadRequest("'delta' must be a string", code="invalid_field")
    return delta


def _context_id(msg: dict[str, Any]) -> str:
    value = msg.get(CONTEXT_KEY)
    if value is None:
        raise BadRequest("'context_id' is required: name the context", code="missing_context_id")
    return limits.check_utterance_id(value, CONTEXT_KEY)


def _flush_id(value: object) -> FlushId | None:
    """A client's name for a flush: a string of up to 64 characters, or an integer >= 0."""
    if value is None:
        return None
    if isinstance(value, str) and 0 < len(value) <= MAX_FLUSH_ID_CHARS:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53:
        return value
    raise BadRequest(
        f"'flush_id' is a string of 1-{MAX_FLUSH_ID_CHARS} characters or an integer >= 0",
        code="invalid_field",
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


def event_frame(event: Event, utterance_id: str, key: str = UTTERANCE_KEY) -> str:
    """A reply's event (not audio: see `audio_frame`) as a text frame; `key` names the id
    (`CONTEXT_KEY` in protocol 2, whose frames carry no `utterance_id`)."""
    body = payload(event)
    body.pop(UTTERANCE_KEY, None)  # `agent_start` and `cancelled` name it: the key does
    return _dump({"type": event.name, key: utterance_id, **body})


def audio_frame(utterance_id: str, data: bytes) -> bytes:
    uid = utterance_id.encode("ascii")
    return bytes([len(uid)]) + uid + data


def error_frame(
    error: ServiceError, utterance_id: str | None = None, key: str = UTTERANCE_KEY
) -> str:
    body: dict[str, Any] = {"type": "error", "code": error.code, "message": error.message}
    body["retryable"] = error.retryable
    body["status"] = error.status  # the HTTP status the gateway's HTTP routes give the code
    if error.retry_after_s is not None:
        body["retry_after_s"] = error.retry_after_s
    if utterance_id:
        body[key] = utterance_id
    return _dump(body)


def cancelled_frame(
    utterance_id: str,
    played_ms: float | None = None,
    heard_text: str | None = None,
    key: str = UTTERANCE_KEY,
) -> str:
    return event_frame(Cancelled(utterance_id, played_ms, heard_text), utterance_id, key)


def context_closed_frame(context_id: str, reason: str) -> str:
    """Protocol 2: a context the server closed (`reason` "idle": no message and nothing to
    say for `--context-idle-s`)."""
    return _dump({"type": "context_closed", CONTEXT_KEY: context_id, "reason": reason})
