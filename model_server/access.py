"""The model server's own credentials: one key shared with its gateways.

With `--api-key` (`MODEL_SERVER_API_KEY`) every route but `/ping` (the platform's and the
kubelet's probe) needs `Authorization: Bearer <key>`, the WebSocket upgrade included; the
gateway's transports send it (`--model-server-key`). Listening beyond loopback without a key
needs `--allow-anonymous`, said out loud; SageMaker's `serve` is anonymous by design (IAM
signs every call before it reaches the container), unless a key is given. A refused WebSocket
upgrade is logged here, once, with its reason (never its query string).
"""

from __future__ import annotations

import hmac
import logging

from starlette.types import ASGIApp, Receive, Scope, Send

from kokoro_contract import asgi_deny
from kokoro_contract.limits import MIN_KEY_CHARS
from kokoro_contract.listen import is_loopback

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/ping"})


def check_listening(host: str, api_key: str, allow_anonymous: bool) -> None:
    """Refuses (ValueError) what cannot be served safely."""
    if api_key and len(api_key) < MIN_KEY_CHARS:
        raise ValueError(f"--api-key is shorter than {MIN_KEY_CHARS} characters")
    if not api_key and not allow_anonymous and not is_loopback(host):
        raise ValueError(
            f"listening on {host} (beyond loopback) without a key: give --api-key "
            "(MODEL_SERVER_API_KEY, the gateways' --model-server-key), or say --allow-anonymous"
        )


class KeyMiddleware:
    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in OPEN_PATHS:
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":  # (uvicorn's access log has HTTP requests' 401)
            log.info("refused WebSocket %s: 401 unauthorized", scope["path"])
        message = "this model server needs 'Authorization: Bearer <key>' (its --api-key)"
        await asgi_deny.deny(scope, receive, send, 401, "unauthorized", message, "model-server")
