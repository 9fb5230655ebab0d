"""kokoro_contract.ws_sender: a client that is gone is `ClientGone`, whether it left before a
frame or before the close (a client may close its side the moment it has asked for the close)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.websockets import WebSocketDisconnect, WebSocketState

from kokoro_contract.ws_sender import ClientGone, WebSocketSender


class _Socket:
    """The part of Starlette's WebSocket the sender uses, failing as a vanished client does."""

    def __init__(self, fails_with: BaseException | None = None) -> None:
        self.application_state = WebSocketState.CONNECTED
        self.fails_with = fails_with
        self.sent: list[Any] = []
        self.closed: tuple[int, str | None] | None = None

    async def send_text(self, data: str) -> None:
        if self.fails_with is not None:
            raise self.fails_with
        self.sent.append(data)

    async def send_bytes(self, data: bytes) -> None:
        await self.send_text(data)  # type: ignore[arg-type]

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        if self.fails_with is not None:
            raise self.fails_with
        self.closed = (code, reason)
        self.application_state = WebSocketState.DISCONNECTED


async def test_frames_then_the_close_reach_the_socket() -> None:
    ws = _Socket()
    sender = WebSocketSender(ws)  # type: ignore[arg-type]
    await sender.send("one")
    await sender.send(b"\x01")
    await sender.close(1000, "bye")
    assert ws.sent == ["one", b"\x01"]
    assert ws.closed == (1000, "bye")
    with pytest.raises(ClientGone):
        await sender.send("after the close")


@pytest.mark.parametrize(
    "failure",
    [WebSocketDisconnect(1006), RuntimeError("Unexpected ASGI message"), OSError("reset")],
)
async def test_a_client_gone_before_the_close_is_client_gone(failure: BaseException) -> None:
    sender = WebSocketSender(_Socket(fails_with=failure))  # type: ignore[arg-type]
    with pytest.raises(ClientGone):
        await sender.close(1000)
    with pytest.raises(ClientGone):
        await sender.send("x")


class _Stuck(_Socket):
    """A client that has stopped reading: its close never completes."""

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        await asyncio.Event().wait()


async def test_a_close_the_client_never_takes_is_client_gone_after_the_timeout() -> None:
    sender = WebSocketSender(_Stuck(), timeout_s=0.01)  # type: ignore[arg-type]
    with pytest.raises(ClientGone, match="took no close"):
        await sender.close(1012)
