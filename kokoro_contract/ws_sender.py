"""Sending on a server-side WebSocket from several tasks: one frame at a time, and a client
that has gone away becomes one exception, `ClientGone`."""

from __future__ import annotations

import asyncio

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState


class ClientGone(Exception):
    """The client is no longer there to send to."""


class WebSocketSender:
    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self._lock = asyncio.Lock()

    async def send(self, data: str | bytes) -> None:
        async with self._lock:
            if self.ws.application_state is not WebSocketState.CONNECTED:
                raise ClientGone()
            try:
                if isinstance(data, bytes):
                    await self.ws.send_bytes(data)
                else:
                    await self.ws.send_text(data)
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise ClientGone() from exc
