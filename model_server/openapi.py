"""What the model server's HTTP routes take and answer, for its OpenAPI schema (/openapi.json).

The routes read their bodies and build their answers themselves (to answer the contract's own
error codes), so FastAPI cannot infer any of it: it is described here, from the same limits
and formats the routes check, and schemathesis tests the live routes against it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST

from kokoro_contract import formats, limits
from kokoro_contract.openapi import JSON
from kokoro_contract.openapi import error_response as _error

INVOCATION_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["text"],
    "properties": {
        "text": {"type": "string", "minLength": 1, "description": "at most --max-text-chars"},
        "voice": {"type": "string", "description": "a loaded voice (GET /voices)"},
        "speed": {"type": "number", "minimum": limits.MIN_SPEED, "maximum": limits.MAX_SPEED},
        "format": {"type": "string", "enum": list(formats.MODEL_SERVER_FORMATS)},
        "stream": {"type": "boolean"},
        "request_id": {
            "type": "string",
            "minLength": 1,
            "maxLength": limits.MAX_REQUEST_ID_CHARS,
            "pattern": "^[ -~]+$",
        },
        "deadline_ms": {"type": "number", "minimum": 0, "maximum": limits.MAX_DEADLINE_MS},
    },
}

_AUDIO = {"schema": {"type": "string", "format": "binary"}}


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
INVOCATIONS: Responses = {
    200: {
        "description": "the audio: whole, or streamed segment by segment with `stream`",
        "content": {f.mime: _AUDIO for f in map(formats.lookup, formats.MODEL_SERVER_FORMATS)},
    },
    400: _error("a bad request"),
    422: _error("unreadable_text: the text could not be converted to speech sounds"),
    500: _error("synthesis_failed or internal_error"),
    **NOT_READY,
}
INVOCATION_REQUEST = {
    "requestBody": {"required": True, "content": {JSON: {"schema": INVOCATION_BODY}}}
}
