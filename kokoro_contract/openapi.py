"""OpenAPI pieces both services describe their routes with: the error body every route answers
(`kokoro_contract.errors.error_body`) and a response carrying it, and a JSON request body."""

from __future__ import annotations

from typing import Any

JSON = "application/json"

ERROR_BODY: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message", "retryable"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "retryable": {"type": "boolean"},
            },
        }
    },
}


def error_response(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": ERROR_BODY}}}


def json_request(schema: dict[str, Any], required: bool = True) -> dict[str, Any]:
    """A route's `openapi_extra` for a JSON request body of `schema`."""
    return {"requestBody": {"required": required, "content": {JSON: {"schema": schema}}}}
