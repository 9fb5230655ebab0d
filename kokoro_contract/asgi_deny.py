"""A refusal at the ASGI edge, before any route runs, for both services: an HTTP request gets
the JSON error body; a WebSocket upgrade gets the HTTP status before it is accepted (the ASGI
denial-response extension), so clients see 401/403 rather than a closed socket."""

from __future__ import annotations

import orjson
from starlette.types import Receive, Scope, Send

from kokoro_contract.errors import error_body

DENIAL_EXTENSION = "websocket.http.response"


async def deny(
    scope: Scope, receive: Receive, send: Send, status: int, code: str, message: str, realm: str
) -> None:
    """Answers `status` with `{"error": {"code", "message"}}`; a 401 names the Bearer `realm`."""
    body = orjson.dumps(error_body(code, message))
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if status == 401:
        headers.append((b"www-authenticate", f'Bearer realm="{realm}"'.encode()))
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return
    message_in = await receive()  # websocket.connect
    if message_in["type"] != "websocket.connect":
        return
    if DENIAL_EXTENSION in scope.get("extensions", {}):
        start = {"type": "websocket.http.response.start", "status": status}
        await send({**start, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008, "reason": code})
