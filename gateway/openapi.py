"""What the gateway's public routes take and answer, for its OpenAPI schema (/openapi.json).

The routes read their bodies themselves (JSON only, checked by `access` first), so FastAPI
cannot infer them: they are described here from the same pydantic models the routes parse
with, and schemathesis tests the live routes against the result.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from gateway.access.keys import DEFAULT_TOKEN_ROUTES, TOKEN_ROUTES
from gateway.params import CancelParams, OpenAISpeechParams, SpeakParams
from kokoro_contract import formats
from kokoro_contract.openapi import JSON, error_response, json_request

Responses = dict[int | str, dict[str, Any]]


def inline(schema: dict[str, Any]) -> dict[str, Any]:
    """A pydantic JSON schema with its `$defs` written in place (OpenAPI resolves `$ref`s
    against the whole document, where pydantic's `#/$defs/...` do not exist)."""
    defs = schema.get("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return resolve(defs[ref.removeprefix("#/$defs/")])
            return {k: resolve(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [resolve(v) for v in node]
        return node

    result: dict[str, Any] = resolve(schema)
    return result


def _body(model: type[BaseModel]) -> dict[str, Any]:
    schema = inline(model.model_json_schema())
    return {"requestBody": {"required": True, "content": {JSON: {"schema": schema}}}}


_REFUSALS: Responses = {
    400: error_response("a bad request (its code says which field)"),
    401: error_response("unauthorized: credentials missing, unknown, forged or expired"),
    403: error_response("origin_not_allowed"),
    429: error_response("too_many_sessions or rate_limited (Retry-After)"),
    503: error_response("overloaded, tts_unavailable or restarting (Retry-After)"),
}
_POSTED: Responses = {
    413: error_response("body_too_large"),
    415: error_response("unsupported_media_type: JSON only"),
}
_EVENTS = {"description": "the reply as Server-Sent Events", "content": {"text/event-stream": {}}}

SPEAK_REQUEST = _body(SpeakParams)
SPEAK_QUERY = {
    "parameters": [
        {"name": name, "in": "query", "required": False, "schema": schema}
        for name, schema in inline(SpeakParams.model_json_schema())["properties"].items()
    ]
    + [{"name": "token", "in": "query", "required": False, "schema": {"type": "string"}}]
}
SPEAK: Responses = {200: _EVENTS, 204: {"description": "an EventSource reconnect"}, **_REFUSALS}
SPEAK_POST: Responses = {200: _EVENTS, **_REFUSALS, **_POSTED}
SPEECH_REQUEST = _body(OpenAISpeechParams)
CANCEL_REQUEST = _body(CancelParams)
CANCEL_REQUEST["requestBody"]["required"] = False
CANCEL: Responses = {
    200: {
        "description": "the reply stopped: what the listener heard of it",
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["utterance_id", "played_ms", "heard_text"],
                }
            }
        },
    },
    404: error_response("unknown_utterance: no reply of yours with this id is playing"),
    **_REFUSALS,
    **_POSTED,
}
SPEECH: Responses = {
    200: {
        "description": "the audio itself, or Server-Sent Events with stream_format sse",
        "content": {
            **{f.mime: {} for f in formats.OPENAI_FORMATS.values()},
            "text/event-stream": {},
        },
    },
    **_REFUSALS,
    **_POSTED,
}
TOKENS_REQUEST = {
    "requestBody": {
        "required": False,
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "routes": {
                            "type": "array",
                            "minItems": 1,
                            "items": {"enum": sorted(TOKEN_ROUTES)},
                            "description": "route groups the token may call (default: "
                            + ", ".join(DEFAULT_TOKEN_ROUTES)
                            + ")",
                        },
                        "ttl_s": {
                            "type": "integer",
                            "minimum": 1,
                            "description": "lifetime, at most --token-ttl-s",
                        },
                        "subject": {
                            "type": "string",
                            "pattern": "^[A-Za-z0-9._:@-]{1,64}$",
                            "description": "the page's visitor id: sessions, replies and "
                            "cancels count per subject within the key's caps (default: a "
                            "random one)",
                        },
                    },
                }
            }
        },
    }
}
TOKENS: Responses = {
    200: {
        "description": "a token for ?token=",
        "content": {
            JSON: {
                "schema": {
                    "type": "object",
                    "required": ["token", "expires_in", "routes", "subject"],
                    "properties": {
                        "token": {"type": "string"},
                        "expires_in": {"type": "integer"},
                        "routes": {"type": "array", "items": {"type": "string"}},
                        "subject": {"type": "string"},
                    },
                }
            }
        },
    },
    **_REFUSALS,
    **_POSTED,
}
VOICES: Responses = {
    200: {
        "description": "the model server's voices, and the client's saved blends",
        "content": {JSON: {}},
    },
    401: _REFUSALS[401],
    403: _REFUSALS[403],
    502: error_response("the model server failed"),
}
SAVE_BLEND: Responses = {
    201: {"description": "saved: its name and canonical blend", "content": {JSON: {}}},
    400: error_response(
        "invalid_field (the name or the blend), invalid_voice, unknown_voice, too_many_blends"
    ),
    401: _REFUSALS[401],
    403: error_response("origin_not_allowed, or token_not_for_route: a token cannot save"),
    **_POSTED,
}
SAVE_BLEND_REQUEST = json_request(
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["name", "blend"],
        "properties": {
            "name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,39}$"},
            "blend": {
                "description": "'af_bella(2)+af_sky(1)', or its parts as a list",
                "oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}],
            },
        },
    }
)
LEXICONS: Responses = {
    200: {
        "description": "the deployment's lexicon and the client's: name, version, entries",
        "content": {JSON: {}},
    },
    401: _REFUSALS[401],
    403: error_response("origin_not_allowed, or token_not_for_route: a key's holder only"),
}
LEXICON: Responses = {
    200: {"description": "name, version and entries", "content": {JSON: {}}},
    401: _REFUSALS[401],
    403: LEXICONS[403],
    404: error_response("unknown_lexicon: the client has no lexicon of that name"),
}
PUT_LEXICON: Responses = {
    200: {"description": "saved: name, version, entries (a count)", "content": {JSON: {}}},
    400: error_response(
        "invalid_field (the name or the body), invalid_lexicon, invalid_ipa, "
        "lexicon_too_large, too_many_lexicons"
    ),
    401: _REFUSALS[401],
    403: LEXICONS[403],
    **_POSTED,
}
PUT_LEXICON_REQUEST = json_request(
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["entries"],
        "properties": {
            "entries": {
                "description": "word or phrase -> IPA between slashes ('/kˈOkəɹO/') or alias "
                "text; a key in lower case matches any case, one with a capital that spelling",
                "type": "object",
                "additionalProperties": {"type": "string"},
            }
        },
    }
)
DELETE_LEXICON: Responses = {
    204: {"description": "forgotten"},
    401: _REFUSALS[401],
    403: LEXICONS[403],
    404: LEXICON[404],
}
DELETE_BLEND: Responses = {
    204: {"description": "forgotten"},
    401: _REFUSALS[401],
    403: error_response("origin_not_allowed, or token_not_for_route: a token cannot delete"),
    404: error_response("unknown_blend: the client has no saved blend of that name"),
}
