"""The gateway as LiveKit sees it, pure (JSON in, LiveKit's values out; no I/O): its `words`
events as LiveKit's timed strings and its errors as LiveKit's. The wire format itself (URLs,
messages, audio frames, the error rule, SSE) is `kokoro_voice_client`'s, shared with the
pipecat plugin."""

from __future__ import annotations

import json
from typing import Any

from kokoro_voice_client.errors import GatewayError
from livekit.agents import APIError, APIStatusError
from livekit.agents.types import TimedString


def timed_words(event: dict[str, Any]) -> list[TimedString]:
    """A `words` event as LiveKit's aligned transcript: one `TimedString` per word, in seconds
    from the utterance's first sample, each followed by the space that joins it to the next
    (LiveKit's transcript joins the strings as they come)."""
    return [
        TimedString(
            f"{word['word']} ",
            start_time=word["start_ms"] / 1000,
            end_time=word["end_ms"] / 1000,
        )
        for word in event.get("words", [])
    ]


def error_from_frame(event: dict[str, Any], request_id: str | None = None) -> APIStatusError:
    """A WebSocket error frame `{"type": "error", "code", "message", "retryable", "status"}`,
    with the HTTP status the gateway gives its code."""
    error = GatewayError.from_frame(event)
    return APIStatusError(
        f"{error.code}: {error.message}",
        status_code=error.status,
        request_id=request_id,
        body=event,
        retryable=error.retryable,
    )


def error_from_http(status: int, body: bytes, request_id: str | None = None) -> APIStatusError:
    """An HTTP error answer, `{"error": {"code", "message", "retryable"}}` (any other body is
    kept as text; retryable then follows the status)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        text = body.decode("utf-8", "replace")[:200]
        return APIStatusError(
            f"HTTP {status}: {text}",
            status_code=status,
            request_id=request_id,
            body=text,
            retryable=status >= 500 or status in (408, 429),
        )
    code = str(error.get("code", "error"))
    return APIStatusError(
        f"{code}: {error.get('message', '')}",
        status_code=status,
        request_id=request_id,
        body=error,
        retryable=bool(error.get("retryable", False)),
    )


def error_from_sse(event: dict[str, Any]) -> APIError:
    """`{"type": "error", "error": {"code", "message"}}` in a speech stream: after the headers,
    so no status; not retryable, since audio may already have been played."""
    error = event.get("error") or {}
    code = str(error.get("code", "error"))
    return APIError(f"{code}: {error.get('message', '')}", body=error, retryable=False)
