"""`WS /v1/speak/ws`: the I/O around `SpeakSession` (rules) and `speak_protocol` (wire format).

Messages are read while an utterance plays, so a `cancel` (barge-in) takes effect at once: the
source stops, queued chunks are dropped and the model server cancels its synthesis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from fastapi import APIRouter, WebSocket

from gateway.aio import cancel_and_wait
from gateway.events import AgentEnd, AudioChunk, ErrorEvent, Event, TextDelta
from gateway.pipeline import Reply
from gateway.routes.common import origin_allowed, service_of
from gateway.service import GatewayService
from gateway.sources.client import ClientTextSource
from gateway.speak_protocol import audio_frame, event_frame, parse_client_message
from gateway.speak_session import (
    Action,
    CancelUtterance,
    CloseConnection,
    EndText,
    FeedText,
    SendError,
    SendFrame,
    SpeakSession,
    StartUtterance,
)
from kokoro_contract.errors import ServiceError
from kokoro_contract.ws_sender import ClientGone, WebSocketSender

log = logging.getLogger(__name__)
router = APIRouter()


class SpeakConnection:
    def __init__(self, ws: WebSocket, service: GatewayService) -> None:
        self.ws = ws
        self.service = service
        self.session = SpeakSession()
        self._sender = WebSocketSender(ws)
        self._task: asyncio.Task[None] | None = None  # the utterance playing now
        self._client_text: ClientTextSource | None = None

    async def run(self) -> None:
        self.service.metrics.active.labels("ws").inc()
        try:
            while not self.session.closed:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                await self._apply(self.session.receive(parse_client_message(message.get("text"))))
        except ClientGone:
            return
        finally:
            if self._task is not None:
                await cancel_and_wait(self._task)
            self.service.metrics.active.labels("ws").dec()

    async def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case SendFrame(frame=frame):
                    await self._sender.send(frame)
                case SendError(error=error):
                    self.service.metrics.errors.labels(error.code).inc()
                    await self._sender.send(action.frame)
                case StartUtterance():
                    await self._start(action)
                case FeedText(delta=delta):
                    assert self._client_text is not None
                    await self._client_text.put(delta)
                case EndText():
                    assert self._client_text is not None
                    await self._client_text.end()
                case CancelUtterance(utterance_id=uid):
                    if self._task is not None:
                        await cancel_and_wait(self._task)  # closes the source and the TTS stream
                    self.service.metrics.cancels.inc()
                    await self._apply(self.session.utterance_cancelled(uid))
                case CloseConnection():
                    await self.ws.close(1000)

    async def _start(self, start: StartUtterance) -> None:
        uid = start.utterance_id
        if self._task is not None:  # the last reply has ended; let its task finish
            await asyncio.wait([self._task])
        try:
            source = self.service.source_for(start.params, start.history)
            transports = await self.service.admit()  # an `overloaded` frame; the session stays
        except ServiceError as exc:
            await self._apply(self.session.start_failed(uid, exc))
            return
        self._client_text = None
        if source is None:
            self._client_text = source = ClientTextSource()
        queue: asyncio.Queue[Event | None] = asyncio.Queue(self.service.settings.queue_size)
        reply = self.service.reply(
            start.params, source, queue, utterance_id=uid, transports=transports
        )
        self._task = asyncio.create_task(self._forward(reply, queue))

    async def _forward(self, reply: Reply, queue: asyncio.Queue[Event | None]) -> None:
        """Run the reply and send its events to the client until it ends."""
        uid = reply.spec.utterance_id
        spoken: list[str] = []
        failed = False
        try:
            async with self.service.running(reply, "ws_reply"):
                while (event := await queue.get()) is not None:
                    if isinstance(event, AudioChunk):
                        await self._sender.send(audio_frame(uid, event.data))
                        continue
                    if isinstance(event, TextDelta):
                        spoken.append(event.text)
                    failed = failed or isinstance(event, ErrorEvent)
                    if isinstance(event, AgentEnd):
                        ended = self.session.utterance_ended(uid, "".join(spoken), failed)
                        await self._apply(ended)
                    await self._sender.send(event_frame(event, uid))
        except ClientGone:
            return


@router.websocket("/v1/speak/ws")
async def speak_ws(ws: WebSocket) -> None:
    service = service_of(ws)
    if not origin_allowed(ws, service.settings.origins):
        await ws.close(1008, "origin not allowed")
        return
    await ws.accept()
    with contextlib.suppress(ClientGone):
        await SpeakConnection(ws, service).run()
