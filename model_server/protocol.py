"""The model server's wire protocol, pure: bytes or text in, typed messages out, and back.

The bidirectional route (`/invocations-bidirectional-stream`) follows the reference container:

client -> server, one JSON object per message, in a text *or binary* frame (SageMaker delivers
every client message as a binary frame unless the caller asked for UTF-8):

    {"text": "...", "voice"?: "...", "speed"?: 1.0, "request_id"?: "..."}   synthesize
    {"type": "cancel", "request_id"?: "..."}                                 drop one (or all)
    {"type": "close"}                                                        end the session

server -> client: JSON control in text frames, audio in binary frames (s16le, 24 kHz, mono):

    {"type": "synthesis_start", "request_id"}
    <binary PCM>...
    {"type": "synthesis_complete", "request_id", "total_duration_s", "elapsed_s", "audio_bytes"}
    {"type": "synthesis_cancelled", "request_id"}
    {"type": "error", "request_id"?, "code", "message"}

A reader that sees frames without their types (SageMaker's PayloadParts) tells them apart with
`parse_control`: a frame that parses entirely as a JSON object is control, anything else is audio.
A first-byte check is wrong because PCM can start with 0x7B (`{`).
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

SAMPLE_RATE = 24_000
SAMPLE_WIDTH = 2  # bytes, s16le
CHANNELS = 1


@dataclass(frozen=True)
class RequestRules:
    """What a synthesis request may ask for; the server fills in defaults from here."""

    voices: frozenset[str]
    default_voice: str
    max_text_chars: int = 5_000
    min_speed: float = 0.5
    max_speed: float = 2.0


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    voice: str
    speed: float
    request_id: str


@dataclass(frozen=True)
class Cancel:
    """Cancel one request, or every pending request of the session when `request_id` is None."""

    request_id: str | None


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class ProtocolError:
    """A message the server cannot act on; answered with an error frame, the session stays."""

    code: str
    message: str
    request_id: str | None = None

    def event(self) -> str:
        return error_event(self.code, self.message, self.request_id)


ClientMessage = SynthesisRequest | Cancel | Close | ProtocolError


def new_request_id() -> str:
    return uuid.uuid4().hex


def decode_frame(data: str | bytes) -> dict[str, Any] | ProtocolError:
    """Decode one client message (text or binary frame) into a JSON object."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return ProtocolError(
                "invalid_utf8", f"binary frame is not UTF-8 text (byte {exc.start})"
            )
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return ProtocolError("invalid_json", f"message is not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return ProtocolError(
            "not_an_object", f"message must be a JSON object, got {type(obj).__name__}"
        )
    return obj


def parse_client_message(data: str | bytes, rules: RequestRules) -> ClientMessage:
    obj = decode_frame(data)
    if isinstance(obj, ProtocolError):
        return obj
    rid = obj.get("request_id")
    request_id = rid if isinstance(rid, str) and rid else None
    kind = obj.get("type", "synthesize")
    if kind == "close":
        return Close()
    if kind == "cancel":
        if rid is not None and request_id is None:
            return ProtocolError("invalid_field", "request_id must be a non-empty string")
        return Cancel(request_id)
    if kind == "synthesize":
        return validate_synthesis(obj, rules)
    return ProtocolError(
        "unknown_type",
        f"unknown message type {kind!r}; expected synthesize, cancel or close",
        request_id,
    )


def validate_synthesis(
    obj: Mapping[str, Any], rules: RequestRules
) -> SynthesisRequest | ProtocolError:
    """Check one synthesis request (WebSocket message or POST body) and fill in defaults."""
    rid = obj.get("request_id")
    if rid is not None and (not isinstance(rid, str) or not rid or len(rid) > 128):
        return ProtocolError("invalid_field", "request_id must be a string of 1-128 characters")
    request_id = rid or new_request_id()

    def fail(code: str, message: str) -> ProtocolError:
        return ProtocolError(code, message, request_id)

    text = obj.get("text")
    if text is None:
        return fail("missing_text", "field 'text' is required")
    if not isinstance(text, str):
        return fail("invalid_field", "field 'text' must be a string")
    if not text.strip():
        return fail("empty_text", "field 'text' is empty")
    if len(text) > rules.max_text_chars:
        return fail(
            "text_too_long",
            f"text has {len(text)} characters; the limit is {rules.max_text_chars}",
        )

    voice = obj.get("voice")
    if voice is None or voice == "":
        voice = rules.default_voice
    if not isinstance(voice, str):
        return fail("invalid_field", "field 'voice' must be a string")
    if voice not in rules.voices:
        known = ", ".join(sorted(rules.voices))
        return fail("unknown_voice", f"unknown voice {voice!r}; loaded voices: {known}")

    speed = obj.get("speed")
    if speed is None:
        speed = 1.0
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not math.isfinite(speed):
        return fail("invalid_speed", "field 'speed' must be a number")
    if not rules.min_speed <= speed <= rules.max_speed:
        return fail(
            "invalid_speed",
            f"speed {speed} is out of range [{rules.min_speed}, {rules.max_speed}]",
        )
    return SynthesisRequest(text=text, voice=voice, speed=float(speed), request_id=request_id)


def invocation_body(text: str, voice: str | None, speed: float) -> dict[str, Any]:
    """A `POST /invocations` body asking for streamed PCM (what both batch transports send)."""
    body: dict[str, Any] = {"text": text, "speed": speed, "format": "pcm", "stream": True}
    if voice:
        body["voice"] = voice
    return body


# --- server -> client -------------------------------------------------------------------------


def _dump(obj: Mapping[str, Any]) -> str:
    return orjson.dumps(obj).decode()


def start_event(request_id: str) -> str:
    return _dump({"type": "synthesis_start", "request_id": request_id})


def complete_event(request_id: str, audio_bytes: int, elapsed_s: float) -> str:
    return _dump(
        {
            "type": "synthesis_complete",
            "request_id": request_id,
            "total_duration_s": round(pcm_duration_s(audio_bytes), 4),
            "elapsed_s": round(elapsed_s, 4),
            "audio_bytes": audio_bytes,
        }
    )


def cancelled_event(request_id: str) -> str:
    return _dump({"type": "synthesis_cancelled", "request_id": request_id})


def error_event(code: str, message: str, request_id: str | None = None) -> str:
    event: dict[str, Any] = {"type": "error"}
    if request_id is not None:
        event["request_id"] = request_id
    event["code"] = code
    event["message"] = message
    return _dump(event)


def pcm_duration_s(n_bytes: int) -> float:
    return n_bytes / (SAMPLE_WIDTH * CHANNELS * SAMPLE_RATE)


def parse_control(frame: bytes | str) -> dict[str, Any] | None:
    """The frame rule for untyped streams: a JSON object is control, anything else is audio."""
    if isinstance(frame, str):
        frame = frame.encode()
    if not frame or frame[:1] not in (b"{", b" ", b"\t", b"\r", b"\n"):
        return None
    try:
        obj = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("type"), str) else None
