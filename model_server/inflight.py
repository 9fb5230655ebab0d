"""In-flight work, for draining: every HTTP request and WebSocket session but /ping itself.

A pure ASGI middleware, so streamed responses and whole WebSocket sessions count until they
really end. `/ping` reports the count; `model-server-drain` (Kubernetes' preStop hook) waits
for it to reach zero before the pod gets SIGTERM.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

UNCOUNTED = frozenset({"/ping", "/load", "/metrics"})


class Inflight:
    """The count, shared by the middleware and /ping."""

    def __init__(self) -> None:
        self.count = 0


class InflightMiddleware:
    def __init__(self, app: ASGIApp, inflight: Inflight) -> None:
        self.app = app
        self.inflight = inflight

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in UNCOUNTED:
            await self.app(scope, receive, send)
            return
        self.inflight.count += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.inflight.count -= 1
