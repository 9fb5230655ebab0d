"""The Kokoro model server: its WebSocket for bidi mode, `POST /invocations` for batch mode."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import WebSocketException

from gateway.aio import cancel_and_wait
from gateway.errors import TTSError
from model_server.protocol import parse_control

BIDI_PATH = "/invocations-bidirectional-stream"
_INPUT_DONE = object()


def ws_url(http_url: str) -> str:
    base = http_url.rstrip("/")
    if base.startswith("https://"):
        return "wss://" + base.removeprefix("https://")
    return "ws://" + base.removeprefix("http://")


class ModelServerSession:
    """One WebSocket session: every chunk is sent the moment it is ready; frames coming back
    are demultiplexed by the frame rule (JSON object = control, anything else = audio)."""

    def __init__(self, ws: ClientConnection, voice: str | None, speed: float) -> None:
        self._ws = ws
        self._voice = voice
        self._speed = speed
        self._prefix = uuid.uuid4().hex[:12]
        self._counter = itertools.count()
        self._pending: set[str] = set()
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.request_ids: list[str] = []

    async def send(self, text: str) -> None:
        rid = f"{self._prefix}-{next(self._counter)}"
        message: dict[str, Any] = {"text": text, "speed": self._speed, "request_id": rid}
        if self._voice:
            message["voice"] = self._voice
        self._pending.add(rid)
        self.request_ids.append(rid)
        try:
            await self._ws.send(orjson.dumps(message).decode())
        except WebSocketException as exc:
            raise TTSError(f"model server session lost: {exc}") from exc

    async def end_input(self) -> None:
        await self._inbox.put(_INPUT_DONE)

    async def read(self) -> None:
        """Runs beside the reply: moves frames from the socket to the inbox."""
        try:
            async for frame in self._ws:
                await self._inbox.put(frame)
        except WebSocketException as exc:
            await self._inbox.put(TTSError(f"model server session lost: {exc}"))
            return
        await self._inbox.put(TTSError("model server closed the session"))

    async def audio(self) -> AsyncIterator[bytes]:
        input_done = False
        while not (input_done and not self._pending):
            item = await self._inbox.get()
            if item is _INPUT_DONE:
                input_done = True
            elif isinstance(item, TTSError):
                raise item
            elif (control := parse_control(item)) is None:
                yield item if isinstance(item, bytes) else item.encode()
            elif control["type"] in ("synthesis_complete", "synthesis_cancelled"):
                self._pending.discard(control.get("request_id", ""))
            elif control["type"] == "error":
                raise TTSError(
                    f"model server: {control.get('message', 'error')}",
                    code=f"tts_{control.get('code', 'error')}",
                    retryable=control.get("code") in ("not_ready", "overloaded"),
                )

    async def cancel(self) -> None:
        with contextlib.suppress(WebSocketException):
            await self._ws.send('{"type": "cancel"}')


class ModelServerTransport:
    def __init__(self, base_url: str, client: httpx.AsyncClient) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client

    @contextlib.asynccontextmanager
    async def session(self, voice: str | None, speed: float) -> AsyncIterator[ModelServerSession]:
        try:
            ws = await connect(ws_url(self.base_url) + BIDI_PATH, max_size=None)
        except (OSError, WebSocketException) as exc:
            raise TTSError(f"model server at {self.base_url} unreachable: {exc}") from exc
        session = ModelServerSession(ws, voice, speed)
        reader = asyncio.create_task(session.read())
        completed = False
        try:
            yield session
            completed = True
        finally:
            if not completed:  # barge-in or failure: stop the model server's work now
                await asyncio.shield(session.cancel())
            else:
                with contextlib.suppress(WebSocketException):
                    await ws.send('{"type": "close"}')
            await asyncio.shield(ws.close())
            await cancel_and_wait(reader)

    async def synthesize(self, text: str, voice: str | None, speed: float) -> AsyncIterator[bytes]:
        body: dict[str, Any] = {"text": text, "speed": speed, "format": "pcm", "stream": True}
        if voice:
            body["voice"] = voice
        try:
            async with self._client.stream(
                "POST", self.base_url + "/invocations", json=body, timeout=httpx.Timeout(60.0)
            ) as response:
                if response.status_code != 200:
                    raise _http_error(response.status_code, await response.aread())
                async for chunk in response.aiter_raw():
                    yield chunk
        except httpx.HTTPError as exc:
            raise TTSError(f"model server at {self.base_url} failed: {exc}") from exc

    async def ready(self) -> bool:
        try:
            r = await self._client.get(self.base_url + "/ping", timeout=2.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    async def voices(self) -> dict[str, Any]:
        try:
            r = await self._client.get(self.base_url + "/voices", timeout=5.0)
        except httpx.HTTPError as exc:
            raise TTSError(f"model server at {self.base_url} unreachable: {exc}") from exc
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
    return TTSError(f"model server: {message}", code=f"tts_{code}", retryable=status >= 500)
