"""The speak WebSocket's connection: the I/O around `SpeakSession` (rules) and `protocol` (wire
format); the route (`gateway.routes.speak_ws`) only accepts it.

Messages are read while an utterance plays, so a `cancel` (barge-in) takes effect at once: the
source stops, queued chunks are dropped and the model server cancels its synthesis. A
connection with no reply playing and no message for `--idle-timeout-s` gets `idle_timeout` and
is closed; a client that takes longer than `--send-timeout-s` to take a frame is dropped.
While the gateway drains (SIGTERM), a connection closes with 1012 (service restart) as soon as
no reply is playing, so the browser module reconnects to another instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fastapi import WebSocket

from gateway.access.keys import Client
from gateway.access.quotas import Lease
from gateway.aio import cancel_and_wait
from gateway.errors import GatewayError
from gateway.reply.events import AgentEnd, AudioChunk, ErrorEvent, Event, TextDelta
from gateway.reply.pipeline import Reply
from gateway.service import GatewayService
from gateway.sources.client import ClientTextSource
from gateway.speak_ws.protocol import audio_frame, event_frame, parse_client_message
from gateway.speak_ws.session import (
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
_DRAINING = object()  # `_next`: the gateway is draining and nothing plays


class SpeakConnection:
    def __init__(
        self, ws: WebSocket, service: GatewayService, client: Client, lease: Lease
    ) -> None:
        """`lease`: the connection's session, which each of its replies runs in."""
        self.ws = ws
        self.service = service
        self.client = client
        self.lease = lease
        settings = service.settings
        self.session = SpeakSession(
            max_text_chars=settings.max_text_chars, max_history_chars=settings.max_history_chars
        )
        self._sender = WebSocketSender(ws, settings.send_timeout_s)
        self._task: asyncio.Task[None] | None = None  # the utterance playing now
        self._reply: Reply | None = None  # and its reply (its words, for heard_text)
        self._client_text: ClientTextSource | None = None

    async def run(self) -> None:
        self.service.metrics.active.labels("ws").inc()
        receiving: asyncio.Task[Any] | None = None
        try:
            while not self.session.closed:
                receiving = receiving or asyncio.create_task(self.ws.receive())
                message = await self._next(receiving)
                if message is _DRAINING:
                    await self._sender.close(1012, "service restart")
                    return
                if message is None:
                    await self._idle_timeout()
                    return
                receiving = None
                if message["type"] == "websocket.disconnect":
                    return
                await self._apply(self.session.receive(parse_client_message(message.get("text"))))
        except ClientGone:
            return
        finally:
            if receiving is not None:
                await cancel_and_wait(receiving)
            if self._task is not None:
                await cancel_and_wait(self._task)
            self.service.metrics.active.labels("ws").dec()

    def _playing(self) -> bool:
        """A reply is producing audio (not one waiting for the client's own text)."""
        waiting_for_text = self._client_text is not None and not self._client_text.ended
        return self._task is not None and not self._task.done() and not waiting_for_text

    async def _next(self, receiving: asyncio.Task[Any]) -> Any | None:
        """The next client message; None once the connection has been idle too long (no
        message and no reply playing for `idle_timeout_s`; a reply that ends restarts it);
        `_DRAINING` once the gateway drains and no reply is playing."""
        loop = asyncio.get_running_loop()
        idle_since = loop.time()
        draining = asyncio.ensure_future(self.service.gate.draining.wait())
        try:
            while True:
                waits: set[asyncio.Future[Any]] = {receiving}
                timeout = None
                if self._playing():
                    assert self._task is not None
                    waits.add(self._task)
                else:
                    if draining.done():
                        return _DRAINING
                    waits.add(draining)
                    limit = self.service.settings.idle_timeout_s
                    timeout = max(0.0, idle_since + limit - loop.time())
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if receiving.done():
                    return receiving.result()
                if draining.done() and not self._playing():
                    return _DRAINING
                if timeout is not None and not draining.done():
                    return None
                idle_since = loop.time()  # the reply ended: idle from now
        finally:
            draining.cancel()

    async def _idle_timeout(self) -> None:
        limit = self.service.settings.idle_timeout_s
        error = GatewayError(
            f"no message and no reply for {limit:.0f} s: closing", code="idle_timeout", status=408
        )
        await self._apply([SendError(error, self.session.utterance_id)])
        await self._sender.close(1000, "idle timeout")

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
                case CancelUtterance(utterance_id=uid, played_ms=played):
                    if self._task is not None:
                        await cancel_and_wait(self._task)  # closes the source and the TTS stream
                    self.service.metrics.cancels.inc()
                    reply = self._reply
                    heard = None if played is None or reply is None else reply.heard(played)
                    await self._apply(self.session.utterance_cancelled(uid, played, heard))
                case CloseConnection():
                    await self._sender.close(1000)

    async def _start(self, start: StartUtterance) -> None:
        uid = start.utterance_id
        if self._task is not None:  # the last reply has ended; let its task finish
            await asyncio.wait([self._task])
        service = self.service
        stack = contextlib.AsyncExitStack()
        params = start.params
        try:
            voice = await service.replies.voices.resolve(params.voice)  # 400s as error frames
            params = params.model_copy(update={"voice": voice})
            source = service.replies.source_for(params, start.history)
            prompt = params.prompt is not None
            # `overloaded` or `rate_limited` frames; the session stays
            admitted = await stack.enter_async_context(
                service.gate.start(self.client, prompt=prompt, session=self.lease)
            )
        except ServiceError as exc:
            await self._apply(self.session.start_failed(uid, exc))
            return
        self._client_text = None
        if source is None:
            self._client_text = source = ClientTextSource()
        queue: asyncio.Queue[Event | None] = asyncio.Queue(service.settings.queue_size)
        reply = service.replies.build(params, source, queue, admitted, utterance_id=uid)
        self._reply = reply
        self._task = asyncio.create_task(self._forward(reply, queue, stack))
        # a task cancelled before it ever ran never enters its `async with`: its place is
        # given back all the same (`Admitted.close` is idempotent)
        self._task.add_done_callback(lambda _: admitted.close())

    async def _forward(
        self, reply: Reply, queue: asyncio.Queue[Event | None], admitted: contextlib.AsyncExitStack
    ) -> None:
        """Run the reply and send its events to the client until it ends, then give back its
        place (`admitted`)."""
        uid = reply.spec.utterance_id
        spoken: list[str] = []
        failed = False
        async with admitted:
            try:
                async with self.service.replies.running(reply, "ws_reply"):
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
