"""The largest request body the model server takes (`--max-body-bytes`): a pure ASGI middleware.

A body declared larger (`Content-Length`) is refused before it is read; one that streams in
without a length (chunked) is refused as soon as it has passed the limit: 413 `body_too_large`
either way, and nothing of it is kept beyond the limit.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kokoro_contract import asgi_deny
from kokoro_contract.errors import ServiceError


class BodyTooLarge(ServiceError):
    code = "body_too_large"
    status = 413


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        message = f"request bodies are limited to {limit} bytes"
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            await asgi_deny.deny(scope, receive, send, 413, "body_too_large", message, "")
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            event = await receive()
            if event["type"] == "http.request":
                seen += len(event.get("body", b""))
                if seen > limit:  # the route reading it answers 413 (the error handlers)
                    raise BodyTooLarge(message)
            return event

        await self.app(scope, limited, send)
