"""The speak WebSocket's connection: the I/O around `SpeakSession` (rules) and `protocol` (wire
format); the route (`gateway.routes.speak_ws`) only accepts it.

Messages are read while an utterance plays, so a `cancel` (barge-in) takes effect at once: the
source stops, queued chunks are dropped and the model server cancels its synthesis. The
receive loop never waits on anything without a limit: the client's own text goes into a bounded
queue (`ClientTextSource`), and a delta past it is refused with `text_queue_full`.

A connection ends:
- with no reply playing and no well-formed message for `--idle-timeout-s`: `idle_timeout`,
  then closed (frames the protocol cannot parse do not count as activity);
- when the client takes longer than `--send-timeout-s` to take a frame: it is dropped; its
  reply ends, what fed it is closed and the connection, its session with it, is given back;
- when the token it was opened with expires: `token_expired`, closed with 1008 (the browser
  module reconnects with a fresh token), whether or not a reply is playing;
- once it has been open `--max-connection-age-s`, whatever its credentials, as soon as no
  reply is playing: `max_connection_age`, closed with 1008;
- while the gateway drains (SIGTERM), as soon as no reply is playing: closed with 1012
  (service restart), so the browser module reconnects to another instance.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from typing import Any

from fastapi import WebSocket

from gateway.access.keys import Client
from gateway.access.quotas import Lease
from gateway.aio import cancel_and_wait
from gateway.errors import GatewayError
from gateway.reply.events import AgentEnd, AudioChunk, ErrorEvent, TextDelta
from gateway.service import GatewayService
from gateway.service.speak import Speech, speak
from gateway.sources.client import ClientTextSource
from gateway.speak_ws.protocol import Invalid, audio_frame, event_frame, parse_client_message
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
# what `_next` gives besides a message: why the connection ends
_DRAINING = object()  # the gateway is draining and nothing plays
_IDLE = object()  # no reply and no well-formed message for `idle_timeout_s`
_EXPIRED = object()  # the token the connection was opened with has expired
_AGED = object()  # open `max_connection_age_s`, and nothing plays
_DROPPED = object()  # a reply's frame timed out: the client is dropped


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
        self._speech: Speech | None = None  # and its reply (its words, for heard_text)
        self._client_text: ClientTextSource | None = None
        self._dropped = False  # a reply could not send to the client in time
        # loop times, set as `run` starts: the last activity, and the hard limits
        self._idle_since = 0.0
        self._expires_at = math.inf
        self._aged_at = math.inf

    async def run(self) -> None:
        self.service.metrics.active.labels("ws").inc()
        loop = asyncio.get_running_loop()
        self._start_clocks(loop.time())
        receiving: asyncio.Task[Any] | None = None
        try:
            while not self.session.closed:
                receiving = receiving or asyncio.create_task(self.ws.receive())
                message = await self._next(receiving)
                if message is _DROPPED:
                    return
                if message is _DRAINING:
                    await self._sender.close(1012, "service restart")
                    return
                if message is _IDLE:
                    await self._idle_timeout()
                    return
                if message is _EXPIRED:
                    await self._end(1008, "token_expired", "the token has expired", status=401)
                    return
                if message is _AGED:
                    limit = self.service.settings.max_connection_age_s
                    said = f"the connection has been open {limit:.0f} s, the limit"
                    await self._end(1008, "max_connection_age", said, status=408)
                    return
                receiving = None
                if message["type"] == "websocket.disconnect":
                    return
                parsed = parse_client_message(message.get("text"))
                if not isinstance(parsed, Invalid):
                    self._idle_since = loop.time()  # junk frames keep nothing open
                await self._apply(self.session.receive(parsed))
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

    def _start_clocks(self, now: float) -> None:
        settings = self.service.settings
        self._idle_since = now
        if settings.max_connection_age_s > 0:
            self._aged_at = now + settings.max_connection_age_s
        if self.client.expires is not None:  # a token's: unix seconds, on the gateway's clock
            self._expires_at = now + (self.client.expires - self.service.wall_clock())

    async def _next(self, receiving: asyncio.Task[Any]) -> Any:
        """The next client message, or why the connection ends: `_DROPPED` (a reply's frame
        timed out), `_EXPIRED` (its token expired, whatever plays); once no reply is playing,
        `_DRAINING` (the gateway drains), `_AGED` (open `max_connection_age_s`) or `_IDLE` (no
        well-formed message for `idle_timeout_s`, counted again from a reply's end)."""
        loop = asyncio.get_running_loop()
        draining = asyncio.ensure_future(self.service.gate.draining.wait())
        try:
            while True:
                if self._dropped:
                    return _DROPPED
                now = loop.time()
                if now >= self._expires_at:
                    return _EXPIRED
                playing = self._playing()
                waits: set[asyncio.Future[Any]] = {receiving}
                if self._task is not None and not self._task.done():
                    waits.add(self._task)  # its end, or its drop
                deadline = self._expires_at
                if not playing:
                    idle_at = self._idle_since + self.service.settings.idle_timeout_s
                    if draining.done():
                        return _DRAINING
                    if now >= self._aged_at:
                        return _AGED
                    if now >= idle_at:
                        return _IDLE
                    waits.add(draining)
                    deadline = min(deadline, self._aged_at, idle_at)
                timeout = None if deadline == math.inf else deadline - now
                await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if receiving.done():
                    return receiving.result()
                if playing and not self._playing():
                    self._idle_since = loop.time()  # the reply ended: idle from now
        finally:
            draining.cancel()

    async def _idle_timeout(self) -> None:
        limit = self.service.settings.idle_timeout_s
        error = GatewayError(
            f"no message and no reply for {limit:.0f} s: closing", code="idle_timeout", status=408
        )
        await self._apply([SendError(error, self.session.utterance_id)])
        await self._sender.close(1000, "idle timeout")

    async def _end(self, close_code: int, code: str, said: str, status: int) -> None:
        """An error frame saying why, then the close with `code` as its reason."""
        error = GatewayError(f"{said}: closing", code=code, status=status)
        await self._apply([SendError(error, self.session.utterance_id)])
        await self._sender.close(close_code, code)

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
                    source = self._client_text
                    assert source is not None
                    if not source.closed and not source.offer(delta):  # closed: nobody reads
                        await self._apply([SendError(self._queue_full(source))])
                case EndText():
                    assert self._client_text is not None
                    self._client_text.end()
                case CancelUtterance(utterance_id=uid, played_ms=played):
                    if self._task is not None:
                        await cancel_and_wait(self._task)  # closes the source and the TTS stream
                    self.service.metrics.cancels.inc()
                    speech = self._speech
                    heard = None if played is None or speech is None else speech.heard(played)
                    await self._apply(self.session.utterance_cancelled(uid, played, heard))
                case CloseConnection():
                    await self._sender.close(1000)

    def _queue_full(self, source: ClientTextSource) -> GatewayError:
        return GatewayError(
            f"{source.max_pending} text deltas are waiting to be spoken, the limit: this delta "
            "was dropped; send fewer, larger deltas",
            code="text_queue_full",
            status=429,
            retryable=True,
        )

    async def _start(self, start: StartUtterance) -> None:
        uid = start.utterance_id
        if self._task is not None:  # the last reply has ended; let its task finish
            await asyncio.wait([self._task])
        speaking = contextlib.AsyncExitStack()
        try:
            # 400s, `overloaded` or `rate_limited` as error frames; the session stays
            speech = await speaking.enter_async_context(
                speak(
                    self.service,
                    self.client,
                    start.params,
                    transport="ws_reply",
                    history=start.history,
                    session=self.lease,
                    client_text=True,
                    utterance_id=uid,
                )
            )
        except ServiceError as exc:
            await self._apply(self.session.start_failed(uid, exc))
            return
        self._client_text = speech.client_text
        self._speech = speech
        self._task = asyncio.create_task(self._forward(speech, speaking))
        # a task cancelled before it ever ran never enters its `async with`: what the reply
        # holds is given back all the same (`Speech.close` does it once)
        self._task.add_done_callback(lambda _: speech.close())

    async def _forward(self, speech: Speech, speaking: contextlib.AsyncExitStack) -> None:
        """Send the reply's events to the client until it ends; `speaking` (the `speak` it
        came from) then gives back what it held. A client that takes no frame in time is
        dropped: the reply stops, its client text is closed and the connection ends (`_next`
        sees `_dropped`)."""
        uid = speech.utterance_id
        spoken: list[str] = []
        failed = False
        try:
            async with speaking:
                async for event in speech:
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
            self._dropped = True
            self.session.utterance_ended(uid, "", failed=True)
