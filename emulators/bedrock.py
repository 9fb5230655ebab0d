"""Bedrock Runtime `ConverseStream` over loopback, in the real wire format.

`POST /model/{modelId}/converse-stream` answers `application/vnd.amazon.eventstream`:
messageStart, one contentBlockDelta per token, contentBlockStop, messageStop, metadata. The
answer is scripted (`BedrockScript.answer`) or echoes the last user message; tokens are paced
like a model. Errors are injected as the service sends them: HTTP errors with `x-amzn-ErrorType`
and a JSON `{"message"}` body before the stream (`ThrottlingException` 429,
`ServiceUnavailableException` 503, `InternalServerException` 500, validation, access), or an
exception message mid-stream after some tokens (0: before the first text), on every stream or
the first `stream_error_times` ones: `modelStreamErrorException` (with `originalStatusCode` and
`originalMessage`), `internalServerException`, `throttlingException`,
`serviceUnavailableException`, `validationException`. SigV4 headers are accepted, not verified.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from emulators.eventstream import event, exception
from gateway.sources.echo import paced, tokens


@dataclass
class BedrockScript:
    answer: str | None = None  # None: echo the last user message
    tps: float = 0.0  # 0: as fast as possible
    first_ms: float = 0.0
    fail_first: int = 0  # answer this many requests with `fail_status`/`fail_code` first
    fail_status: int = 429
    fail_code: str = "ThrottlingException"
    stream_error_after: int | None = None  # tokens, then `stream_error` (0: before any text)
    stream_error: str = "modelStreamErrorException"  # the exception event's type
    stream_error_times: int | None = None  # streams it breaks, the first ones (None: all)
    stop_reason: str = "end_turn"  # messageStop's (max_tokens, guardrail_intervened, ...)
    requests: list[dict[str, Any]] = field(default_factory=list)
    model_ids: list[str] = field(default_factory=list)


def _error(status: int, code: str, message: str) -> Response:
    return Response(
        orjson.dumps({"message": message}),
        status_code=status,
        headers={
            "x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/",
            "Content-Type": "application/json",
        },
    )


def stream_exception(kind: str) -> bytes:
    """An exception message in the event stream, with the members the service sends."""
    if kind == "modelStreamErrorException":
        return exception(
            kind,
            "injected model stream error",
            originalStatusCode=500,
            originalMessage="model failed",
        )
    return exception(kind, f"injected {kind}")


def create_bedrock_emulator(script: BedrockScript | None = None) -> FastAPI:
    app = FastAPI()
    app.state.script = script or BedrockScript()

    @app.post("/model/{model_id:path}/converse-stream")
    async def converse_stream(model_id: str, request: Request) -> Response:
        s: BedrockScript = app.state.script
        body: dict[str, Any] = orjson.loads(await request.body())
        s.requests.append(body)
        s.model_ids.append(model_id)
        if s.fail_first > 0:
            s.fail_first -= 1
            return _error(s.fail_status, s.fail_code, f"injected {s.fail_code}")
        if model_id.startswith("invalid"):
            return _error(
                400, "ValidationException", f"The provided model identifier is invalid: {model_id}"
            )
        answer = s.answer
        if answer is None:
            last = [m for m in body.get("messages", []) if m.get("role") == "user"][-1]
            answer = "".join(part.get("text", "") for part in last["content"])
        words = tokens(answer)
        error_after, error_kind = s.stream_error_after, s.stream_error
        if s.stream_error_times is not None:
            if s.stream_error_times > 0:
                s.stream_error_times -= 1
            else:  # the scripted broken streams are over
                error_after = None

        async def stream() -> AsyncIterator[bytes]:
            started = time.perf_counter()
            yield event("messageStart", {"role": "assistant"})
            i = 0
            async for token in paced(words, s.tps, s.first_ms):
                if error_after is not None and i == error_after:
                    yield stream_exception(error_kind)
                    return
                yield event("contentBlockDelta", {"delta": {"text": token}, "contentBlockIndex": 0})
                i += 1
            yield event("contentBlockStop", {"contentBlockIndex": 0})
            yield event("messageStop", {"stopReason": s.stop_reason})
            usage = {
                "inputTokens": 10,
                "outputTokens": len(words),
                "totalTokens": 10 + len(words),
            }
            latency = int((time.perf_counter() - started) * 1000)
            yield event("metadata", {"usage": usage, "metrics": {"latencyMs": latency}})

        return StreamingResponse(stream(), media_type="application/vnd.amazon.eventstream")

    return app
