"""A local OpenAI-compatible chat server that streams real `chat.completion.chunk` SSE."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse


def create_stub(
    answer_tokens: list[str], fail_first: int = 0, stall_after: int | None = None
) -> FastAPI:
    """`fail_first` requests are answered 503 first; with `stall_after`, the answer stops after
    that many tokens and the stream stays open, silent (an LLM that hangs mid-answer)."""
    app = FastAPI()
    app.state.requests = []
    app.state.fail_first = fail_first
    app.state.stalled = asyncio.Event()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Response:
        body: dict[str, Any] = await request.json()
        app.state.requests.append(body)
        if body.get("model") == "missing-model":
            return JSONResponse({"error": {"message": "model not found"}}, status_code=404)
        if app.state.fail_first > 0:
            app.state.fail_first -= 1
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
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
            for i, token in enumerate(answer_tokens):
                if i == stall_after:
                    app.state.stalled.set()
                    await asyncio.Event().wait()  # until the client goes away
                chunk = {
                    **base,
                    "choices": [{"index": 0, "delta": {"content": token}, "finish_reason": None}],
                }
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            last = {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            yield b"data: " + orjson.dumps(last) + b"\n\ndata: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return app


def llm_gateway_settings(model_server_url: str, llm_url: str, **overrides: Any) -> Any:
    """A gateway's settings with this stub as its LLM."""
    from gateway.config import Settings

    return Settings(
        **{
            "model_server_url": model_server_url,
            "llm": "openai",
            "openai_base_url": llm_url + "/v1",
            "openai_model": "stub-model",
            **overrides,
        }
    )
