"""Sending on a server-side WebSocket from several tasks: one frame at a time, and a client
that has gone away, or takes longer than `timeout_s` to take one frame (it stopped reading: its
socket buffers are full), becomes one exception, `ClientGone`. Once a frame has timed out the
connection is unusable (that frame may be half written): every later send or close is
`ClientGone` at once (`gone`), so no other task waits out a timeout of its own."""

from __future__ import annotations

import asyncio

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState


class ClientGone(Exception):
    """The client is no longer there to send to."""


class WebSocketSender:
    def __init__(self, ws: WebSocket, timeout_s: float | None = None) -> None:
        self.ws = ws
        self.timeout_s = timeout_s
        self.gone = False  # a frame or the close timed out: the client is dropped
        self._lock = asyncio.Lock()

    async def send(self, data: str | bytes) -> None:
        async with self._lock:
            if self.gone or self.ws.application_state is not WebSocketState.CONNECTED:
                raise ClientGone()
            try:
                async with asyncio.timeout(self.timeout_s):
                    if isinstance(data, bytes):
                        await self.ws.send_bytes(data)
                    else:
                        await self.ws.send_text(data)
            except TimeoutError as exc:
                self.gone = True
                raise ClientGone(f"the client took no frame for {self.timeout_s} s") from exc
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise ClientGone() from exc

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """Close the connection; `ClientGone` when the client went first (it may close its side
        the moment it has asked for the close) or takes no close frame for `timeout_s`."""
        async with self._lock:
            if self.gone or self.ws.application_state is not WebSocketState.CONNECTED:
                raise ClientGone()
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self.ws.close(code, reason)
            except TimeoutError as exc:
                self.gone = True
                raise ClientGone(f"the client took no close for {self.timeout_s} s") from exc
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise ClientGone() from exc
