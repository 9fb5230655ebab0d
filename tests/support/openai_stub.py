"""A local OpenAI-compatible chat server that streams real `chat.completion.chunk` SSE."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


def create_stub(answer_tokens: list[str]) -> FastAPI:
    app = FastAPI()
    app.state.requests = []

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        app.state.requests.append(body)
        if body.get("model") == "missing-model":
            return JSONResponse({"error": {"message": "model not found"}}, status_code=404)
        assert body["stream"] is True

        async def chunks() -> AsyncIterator[bytes]:
            created = int(time.time())
            base = {
                "id": "chatcmpl-stub",
                "object": "chat.completion.chunk",
                "created": created,
                "model": body["model"],
            }
            first = {
                **base,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
            }
            yield b"data: " + orjson.dumps(first) + b"\n\n"
            for token in answer_tokens:
                chunk = {
                    **base,
                    "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}],
                }
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app
