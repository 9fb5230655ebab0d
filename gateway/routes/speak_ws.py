"""`WS /v1/speak/ws`: JSON control in text frames, audio in binary frames, many utterances.

client -> server (text frames, JSON):
    {"type": "speak", "text"|"prompt"?, "mode", "format", "voice", "speed", "utterance_id"?}
        without text or prompt, the client streams its own text:
    {"type": "text", "delta": "..."}    more text for the current utterance
    {"type": "flush"}                   no more text for it
    {"type": "cancel"}                  barge-in: stop the source, drop queued chunks, cancel
                                        synthesis in the model server; answers `cancelled`
    {"type": "close"}

server -> client: the SSE events as JSON text frames (with "type" and "utterance_id"), except
audio: binary frames of [1 byte: n][n bytes: utterance id, ASCII][whole codec units].
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket

from gateway.aio import cancel_and_wait
from gateway.errors import BadRequest, GatewayError
from gateway.events import AgentEnd, AudioChunk, Cancelled, Event, TextDelta, payload
from gateway.params import SpeakParams, parse
from gateway.pipeline import Reply
from gateway.routes.common import origin_allowed, service_of
from gateway.service import GatewayService
from gateway.sources.client import ClientTextSource
from model_server.ws_sender import ClientGone, WebSocketSender

log = logging.getLogger(__name__)
router = APIRouter()


def audio_frame(utterance_id: str, data: bytes) -> bytes:
    uid = utterance_id.encode("ascii")
    return bytes([len(uid)]) + uid + data


class SpeakSession:
    def __init__(self, ws: WebSocket, service: GatewayService) -> None:
        self.ws = ws
        self.service = service
        self._sender = WebSocketSender(ws)
        self._reply: Reply | None = None
        self._task: asyncio.Task[None] | None = None
        self._client_text: ClientTextSource | None = None
        self.history: list[dict[str, str]] = []  # conversation turns, for LLM prompts

    async def send_json(self, body: dict[str, Any]) -> None:
        await self._send(orjson.dumps(body).decode())

    async def _send(self, data: str | bytes) -> None:
        await self._sender.send(data)

    async def error(self, exc: GatewayError, utterance_id: str | None = None) -> None:
        self.service.metrics.errors.labels(exc.code).inc()
        body: dict[str, Any] = {"type": "error", "code": exc.code, "message": exc.message}
        body["retryable"] = exc.retryable
        if utterance_id:
            body["utterance_id"] = utterance_id
        await self.send_json(body)

    # --- the connection ---------------------------------------------------------------------

    async def run(self) -> None:
        self.service.metrics.active.labels("ws").inc()
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                if message.get("text") is None:
                    await self.error(BadRequest("send JSON in text frames", code="binary_frame"))
                    continue
                try:
                    if await self._handle(message["text"]):
                        await self.ws.close(1000)
                        return
                except GatewayError as exc:
                    await self.error(exc)
        except ClientGone:
            return
        finally:
            if self._task is not None:
                await cancel_and_wait(self._task)
            self.service.metrics.active.labels("ws").dec()

    async def _handle(self, text: str) -> bool:
        try:
            msg = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"message is not JSON: {exc}", code="invalid_json") from exc
        if not isinstance(msg, dict):
            raise BadRequest("message must be a JSON object", code="not_an_object")
        kind = msg.pop("type", None)
        if kind == "speak":
            await self._speak(msg)
        elif kind == "text":
            delta = msg.get("delta")
            if not isinstance(delta, str):
                raise BadRequest("'delta' must be a string", code="invalid_field")
            await self._client_source().put(delta)
        elif kind == "flush":
            await self._client_source().end()
        elif kind == "cancel":
            await self._cancel()
        elif kind == "close":
            return True
        else:
            raise BadRequest(
                f"unknown message type {kind!r}; expected speak, text, flush, cancel or close",
                code="unknown_type",
            )
        return False

    def _client_source(self) -> ClientTextSource:
        if self._client_text is None or self._client_text.ended or not self._busy():
            raise BadRequest(
                "no utterance is waiting for text: send speak without text or prompt first",
                code="no_open_utterance",
            )
        return self._client_text

    def _busy(self) -> bool:
        return self._task is not None and not self._task.done()

    async def _speak(self, msg: dict[str, Any]) -> None:
        if self._busy():
            raise BadRequest(
                "an utterance is still playing: cancel it first (barge-in)", code="busy"
            )
        params = parse(SpeakParams, msg)
        source = self.service.source_for(params, self.history)
        self._client_text = None
        if source is None:
            self._client_text = source = ClientTextSource()
        queue: asyncio.Queue[Event | None] = asyncio.Queue(self.service.settings.queue_size)
        self._reply = reply = self.service.reply(params, source, queue)
        self._task = asyncio.create_task(self._play(reply, queue, params.prompt))

    async def _play(
        self, reply: Reply, queue: asyncio.Queue[Event | None], prompt: str | None
    ) -> None:
        uid = reply.spec.utterance_id
        spoken: list[str] = []
        try:
            async with self.service.running(reply, "ws_reply"):
                while (event := await queue.get()) is not None:
                    if isinstance(event, AudioChunk):
                        await self._send(audio_frame(uid, event.data))
                        continue
                    if isinstance(event, TextDelta):
                        spoken.append(event.text)
                    body = {"type": event.name, "utterance_id": uid, **payload(event)}
                    if isinstance(event, AgentEnd) and prompt is not None:
                        self.history += [
                            {"role": "user", "content": prompt},
                            {"role": "assistant", "content": "".join(spoken)},
                        ]
                    await self.send_json(body)
        except ClientGone:
            return

    async def _cancel(self) -> None:
        reply, task = self._reply, self._task
        if reply is None or task is None or task.done():
            raise BadRequest("nothing to cancel", code="nothing_to_cancel")
        await cancel_and_wait(task)  # closes the source and the TTS session
        self.service.metrics.cancels.inc()
        uid = reply.spec.utterance_id
        await self.send_json({"type": "cancelled", **payload(Cancelled(uid))})


@router.websocket("/v1/speak/ws")
async def speak_ws(ws: WebSocket) -> None:
    service = service_of(ws)
    if not origin_allowed(ws, service.settings.origins):
        await ws.close(1008, "origin not allowed")
        return
    await ws.accept()
    with contextlib.suppress(ClientGone):
        await SpeakSession(ws, service).run()
