"""What the model server's HTTP routes take and answer, for its OpenAPI schema (/openapi.json).

The routes read their bodies and build their answers themselves (to answer the contract's own
error codes), so FastAPI cannot infer any of it: it is described here, from the same limits
and formats the routes check, and schemathesis tests the live routes against it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from kokoro_contract import formats, languages, limits
from kokoro_contract.audio import SAMPLE_RATE
from kokoro_contract.openapi import JSON, json_request
from kokoro_contract.openapi import error_response as _error
from kokoro_contract.protocol import NORMALIZE as NORMALIZE_CHOICES

LANGUAGE: dict[str, Any] = {
    "type": "string",
    "description": "the text's language: Kokoro's letter or an ISO name ("
    + languages.known()
    + "); none: its script's and its voice's",
}
NORMALIZE: dict[str, Any] = {
    "type": "string",
    "enum": list(NORMALIZE_CHOICES),
    "description": "auto (the default) and on: English numbers, money, addresses, phones, dates "
    "and codes read as words first; off: English read as written (the other languages' readers "
    "keep their own rules)",
}
INVOCATION_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["text"],
    "properties": {
        "text": {"type": "string", "minLength": 1, "description": "at most --max-text-chars"},
        "voice": {"type": "string", "description": "a loaded voice (GET /voices)"},
        "speed": {"type": "number", "minimum": limits.MIN_SPEED, "maximum": limits.MAX_SPEED},
        "language": LANGUAGE,
        "normalize": NORMALIZE,
        "format": {"type": "string", "enum": list(formats.MODEL_SERVER_FORMATS)},
        "stream": {"type": "boolean"},
        "request_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": limits.MAX_REQUEST_ID_CHARS,
            "pattern": "^[ -~]+$",
        },
        "deadline_ms": {"type": "number", "minimum": 0, "maximum": limits.MAX_DEADLINE_MS},
        "timestamps": {
            "type": "boolean",
            "description": "word timings: with stream false, a JSON answer (audio as base64 "
            "beside its words); with stream true, refused (invalid_field)",
        },
    },
}

_AUDIO = {"schema": {"type": "string", "format": "binary"}}
WORD: dict[str, Any] = {
    "type": "object",
    "required": ["word", "start_s", "end_s"],
    "properties": {
        "word": {"type": "string", "description": "as the text spelled it"},
        "start_s": {"type": "number", "minimum": 0},
        "end_s": {"type": "number", "minimum": 0},
    },
}
TIMED_AUDIO: dict[str, Any] = {
    "type": "object",
    "required": ["audio", "format", "sample_rate", "words"],
    "properties": {
        "audio": {
            "type": "string",
            "format": "byte",
            "description": "the audio in `format`, base64",
        },
        "format": {"type": "string", "enum": list(formats.MODEL_SERVER_FORMATS)},
        "sample_rate": {"type": "integer", "enum": [SAMPLE_RATE]},
        "words": {
            "type": "array",
            "items": WORD,
            "description": "seconds from the audio's first sample",
        },
    },
}


def _json(description: str, required: list[str]) -> dict[str, Any]:
    schema = {"type": "object", "required": required}
    return {"description": description, "content": {JSON: {"schema": schema}}}


Responses = dict[int | str, dict[str, Any]]

NOT_READY: Responses = {503: _error("not_ready: the model is not loaded yet")}
PING: Responses = {
    200: _json("ready", ["status", "inflight", "engine", "voice"]),
    503: _json("loading, failed, or stuck (the watchdog)", ["status", "detail", "inflight"]),
}
LOAD: Responses = {
    200: _json("how far behind the engine is", ["workers", "busy", "waiting", "inflight"]),
    503: _error("not_ready (the model is not loaded yet) or stuck (the watchdog)"),
}
METRICS: Responses = {
    200: {"description": "Prometheus text", "content": {CONTENT_TYPE_LATEST: {}}},
}
VOICES: Responses = {
    200: _json("the loaded voices", ["default", "voices"]),
    **NOT_READY,
}
PHONEMIZE: Responses = {
    200: _json(
        "how the text would be read (its language, by name or by its script and voice; the "
        "voice), what the G2P makes of it, and the segments the engine would voice, nothing "
        "voiced",
        ["language", "voice", "g2p", "phonemes", "segments"],
    ),
    400: _error("a bad request"),
    422: _error("unreadable_text: the text could not be converted to speech sounds"),
    **NOT_READY,
}
PHONEMIZE_REQUEST = json_request(
    {
        "type": "object",
        "required": ["text"],
        "properties": {
            "text": {"type": "string", "minLength": 1},
            "language": LANGUAGE,
            "voice": {"type": "string", "description": "a loaded voice, or a blend of them"},
            "normalize": NORMALIZE,
        },
    }
)
INVOCATIONS: Responses = {
    200: {
        "description": "the audio: whole, or streamed segment by segment with `stream`; with "
        "`timestamps` (and stream false) JSON: the audio as base64 and its word timings",
        "content": {
            **{f.mime: _AUDIO for f in map(formats.lookup, formats.MODEL_SERVER_FORMATS)},
            JSON: {"schema": TIMED_AUDIO},
        },
    },
    400: _error("a bad request"),
    413: _error("synthesis_too_long: without `stream`, estimated past --invocation-timeout-s"),
    422: _error("unreadable_text: the text could not be converted to speech sounds"),
    500: _error("synthesis_failed or internal_error"),
    **NOT_READY,
}
INVOCATION_REQUEST = {
    "requestBody": {"required": True, "content": {JSON: {"schema": INVOCATION_BODY}}}
}
