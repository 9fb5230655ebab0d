"""A streamed answer that can fail after its headers: `CutStreamingResponse`, for both services.

A streamed body (the model server's `POST /invocations` with `"stream": true`, the gateway's
`/v1/audio/speech`) sends its 200 and headers before the first audio. If the synthesis fails
after that, a body that simply ended would read as a whole, short answer. So the connection is
dropped instead, before the body's last chunk: an HTTP client reads a broken stream (httpx:
`RemoteProtocolError`), and SageMaker, reading the container, tells its caller
`ModelStreamError`. The route logs why; uvicorn's own line for an answer left unfinished
("ASGI callable returned without completing response.") says nothing more and is dropped."""

from __future__ import annotations

import logging

from fastapi.responses import StreamingResponse
from starlette.types import Send

UNFINISHED = "ASGI callable returned without completing response."


class StreamCut(Exception):
    """Raised by a body iterator whose answer cannot be finished (it has logged why)."""


class CutStreamingResponse(StreamingResponse):
    """A `StreamingResponse` whose body iterator may raise `StreamCut`: its last chunk is then
    never sent, and the server closes the connection."""

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                data = (
                    chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
                )
                await send({"type": "http.response.body", "body": data, "more_body": True})
        except StreamCut:
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class _UnfinishedNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != UNFINISHED


logging.getLogger("uvicorn.error").addFilter(_UnfinishedNoise())
