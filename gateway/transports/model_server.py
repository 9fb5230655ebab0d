"""The Kokoro model server: its WebSocket for bidi mode, `POST /invocations` for batch mode,
and what the gateway asks of it besides (`/load`, `/ping`, `/voices`): the only place the
gateway speaks HTTP or WebSocket to a model server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosedError, WebSocketException

from gateway.aio import cancel_and_wait
from gateway.errors import TTSError, model_server_error
from gateway.transports.base import Piece
from gateway.transports.captioned import captioned_pieces
from gateway.transports.framed_stream import FrameCarrier, FramedSessions
from kokoro_contract import protocol
from kokoro_contract.errors import brief
from kokoro_contract.load import LoadReport, MalformedLoadReport
from kokoro_contract.protocol import TextOptions, invocation_body

STALL_TIMEOUT_S = 2.0
OPEN_TIMEOUT_S = 5.0  # a model server accepts within 250 ms (SageMaker's rule); a frozen one never


def ws_url(http_url: str) -> str:
    base = http_url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base.removeprefix("https://")
    return "ws://" + base.removeprefix("http://")


class LoadTimeout(TTSError):
    """The model server did not answer `/load` in time: busy for a moment, or gone (the
    caller's rules tell which, from when it last answered)."""


KEEPALIVE = "keepalive ping timeout"  # how websockets closes a session whose pong never came


class _WebSocketReader:
    """Moves the model server's frames into the session's carrier until the socket ends."""

    def __init__(self, ws: ClientConnection, carrier: FrameCarrier) -> None:
        self.ws = ws
        self.carrier = carrier

    async def run(self) -> None:
        try:
            async for frame in self.ws:
                await self.carrier.received(frame)
        except ConnectionClosedError as exc:
            if exc.sent is not None and exc.sent.reason == KEEPALIVE:  # frozen, or cut off
                stalled = "the model server stopped answering (no pong to the session's ping)"
                await self.carrier.failed(TTSError(stalled, code="tts_stalled"))
            else:
                await self.carrier.failed(TTSError(f"model server session lost: {exc}"))
            return
        except WebSocketException as exc:
            await self.carrier.failed(TTSError(f"model server session lost: {exc}"))
            return
        await self.carrier.failed(TTSError("model server closed the session"))


class ModelServerTransport(FramedSessions):
    def __init__(
        self,
        base_url: str,
        client: httpx.AsyncClient,
        probe: httpx.AsyncClient | None = None,
        tts_timeout_s: float | None = None,
        stall_timeout_s: float | None = STALL_TIMEOUT_S,
    ) -> None:
        """`client` carries synthesis and voices; `probe`, with short timeouts, the load
        and readiness probes (never queued behind synthesis). The
        WebSocket sends the `Authorization` header `client` sends (the model server's key),
        and pings the model server every `stall_timeout_s / 2`: a session whose pong is
        `stall_timeout_s` late (a frozen process, a cut network) fails with `tts_stalled`,
        whatever audio the listener still has buffered (None: no pings)."""
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._probe = probe or client
        self.tts_timeout_s = tts_timeout_s
        self.stall_timeout_s = stall_timeout_s

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[FrameCarrier]:
        """One WebSocket session, its frames read into the carrier until the socket ends."""
        try:
            stall = self.stall_timeout_s
            ws = await connect(
                ws_url(self.base_url) + protocol.PATH,
                max_size=None,
                open_timeout=OPEN_TIMEOUT_S,
                ping_interval=None if stall is None else stall / 2,
                ping_timeout=stall,
                close_timeout=0.5,  # a frozen peer never answers the close either
                additional_headers=[
                    (k, v) for k, v in self._client.headers.items() if k == "authorization"
                ],
            )
        except (OSError, WebSocketException, TimeoutError) as exc:
            raise TTSError(
                "the model server is unreachable",
                detail=f"model server at {self.base_url} unreachable: {brief(exc)}",
            ) from exc

        async def send_frame(frame: str) -> None:
            try:
                await ws.send(frame)
            except WebSocketException as exc:
                raise TTSError(f"model server session lost: {exc}") from exc

        carrier = FrameCarrier(send_frame, self.tts_timeout_s)
        reader = asyncio.create_task(_WebSocketReader(ws, carrier).run())
        completed = False
        try:
            yield carrier
            completed = True
        finally:
            # done: close the session; barge-in or failure: stop the model server's work now
            ending = protocol.close_message() if completed else protocol.cancel_message()
            with contextlib.suppress(TTSError):
                await asyncio.shield(send_frame(ending))
            await asyncio.shield(ws.close())
            await cancel_and_wait(reader)

    async def synthesize(
        self,
        text: str,
        voice: str | None,
        speed: float,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncGenerator[Piece]:
        body = invocation_body(text, voice, speed, timestamps, options)
        try:
            async with self._client.stream(
                "POST", self.base_url + "/invocations", json=body, timeout=httpx.Timeout(60.0)
            ) as response:
                if response.status_code != 200:
                    raise _http_error(response.status_code, await response.aread())
                if timestamps:  # one JSON answer: the timings, then the audio
                    for piece in captioned_pieces(await response.aread()):
                        yield piece
                    return
                async for chunk in response.aiter_raw():
                    yield chunk
        except httpx.HTTPError as exc:
            raise TTSError(
                "the model server's stream failed",
                detail=f"model server at {self.base_url} failed: {brief(exc)}",
            ) from exc

    async def load(self, timeout_s: float | None = None) -> LoadReport:
        """The model server's `GET /load` report, asked on the probe client, waiting
        `timeout_s` (None: the probe client's own timeout). Raises `LoadTimeout` when no
        answer comes in time, and `TTSError` when it cannot be reached or answers wrongly (an
        error status, or a body that is no load report: `MalformedLoadReport`)."""
        timeout = httpx.USE_CLIENT_DEFAULT if timeout_s is None else timeout_s
        try:
            response = await self._probe.get(self.base_url + "/load", timeout=timeout)
            response.raise_for_status()
            return LoadReport.decode(response.content)
        except httpx.TimeoutException as exc:
            raise LoadTimeout(
                "the model server did not report its load in time",
                detail=f"model server at {self.base_url}: /load: {brief(exc)}",
            ) from exc
        except (httpx.HTTPError, MalformedLoadReport) as exc:
            raise TTSError(
                "the model server did not report its load",
                detail=f"model server at {self.base_url}: /load: {brief(exc)}",
            ) from exc

    async def ready(self) -> bool:
        try:
            r = await self._probe.get(self.base_url + "/ping", timeout=2.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def voices(self) -> dict[str, Any]:
        try:
            r = await self._client.get(self.base_url + "/voices", timeout=5.0)
        except httpx.HTTPError as exc:
            raise TTSError(
                "the model server is unreachable",
                detail=f"model server at {self.base_url} unreachable: {brief(exc)}",
            ) from exc
        if r.status_code != 200:
            raise _http_error(r.status_code, r.content)
        result: dict[str, Any] = r.json()
        return result


def _http_error(status: int, body: bytes) -> TTSError:
    try:
        error = orjson.loads(body)["error"]
        code, message = error["code"], error["message"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        code, message = "error", body[:200].decode(errors="replace")
    return model_server_error(code, message, retryable=status >= 500)
