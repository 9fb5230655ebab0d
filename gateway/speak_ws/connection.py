"""The speak WebSocket's connection: the I/O around the session's rules (`SpeakSession` in
protocol 1, `ContextSession` in protocol 2) and `protocol` (wire format); the route
(`gateway.routes.speak_ws`) only accepts it.

Messages are read while utterances play, so a `cancel` (barge-in) takes effect at once: the
source stops, queued chunks are dropped and the model server cancels its synthesis. Each
utterance (a context, in protocol 2) runs in a task of its own, from its admission to its
last frame; protocol 1 reads the next message only once an utterance has started (or been
refused), protocol 2 goes on at once (text for a context still being admitted waits with it).
The receive loop never waits on anything without a limit: the client's own text goes into a
bounded queue (`ClientTextSource`), and a delta past it is refused with `text_queue_full`.

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
A reply is playing while its task runs, unless it takes the client's text and waits for it.
In protocol 2 a context idle past `--context-idle-s` is stopped and closed (`context_closed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from fastapi import WebSocket

from gateway.access.keys import Client
from gateway.access.quotas import Lease
from gateway.aio import cancel_and_wait
from gateway.errors import GatewayError
from gateway.reply.events import AgentEnd, AudioChunk, ErrorEvent, Event, TextDelta
from gateway.service import GatewayService
from gateway.service.speak import Speech, speak
from gateway.sources.base import FlushMark
from gateway.sources.client import MAX_PENDING, ClientTextSource
from gateway.speak_ws.contexts import ContextSession
from gateway.speak_ws.protocol import (
    CONTEXT_KEY,
    UTTERANCE_KEY,
    ClientMessage,
    Invalid,
    audio_frame,
    event_frame,
    parse_client_message,
)
from gateway.speak_ws.session import (
    Action,
    CancelUtterance,
    CloseConnection,
    EndText,
    ExpireContext,
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
_CONTEXTS = object()  # protocol 2: a context may be idle


@dataclass(eq=False)
class _Running:
    """One utterance (a context) of the connection, from its `speak` to its last frame."""

    utterance_id: str
    task: asyncio.Task[None] | None = None
    speech: Speech | None = None  # once admitted: its reply (its words, for heard_text)
    client_text: ClientTextSource | None = None  # and where the client's text goes
    started: asyncio.Event = field(default_factory=asyncio.Event)  # admitted, or refused
    # the client's text and flushes that came before it was admitted, and whether it ended
    early: list[str | FlushMark] = field(default_factory=list)
    early_end: bool = False

    def playing(self) -> bool:
        """Its task runs, and it is not a reply waiting for its client's text."""
        if self.task is None or self.task.done():
            return False
        source = self.client_text
        if source is None or source.ended or self.speech is None:
            return True
        return not self.speech.reply.waiting_for_text()


class SpeakConnection:
    def __init__(
        self,
        ws: WebSocket,
        service: GatewayService,
        client: Client,
        lease: Lease,
        version: int = 1,
    ) -> None:
        """`lease`: the connection's session, which each of its replies runs in; `version`:
        the protocol (1, or 2 for several contexts)."""
        self.ws = ws
        self.service = service
        self.client = client
        self.lease = lease
        self.version = version
        settings = service.settings
        self.session: SpeakSession | ContextSession
        if version == 2:
            self.session = ContextSession(
                max_text_chars=settings.max_text_chars,
                max_history_chars=settings.max_history_chars,
                max_contexts=settings.max_contexts_per_socket,
                idle_s=settings.context_idle_s,
            )
        else:
            self.session = SpeakSession(
                max_text_chars=settings.max_text_chars,
                max_history_chars=settings.max_history_chars,
            )
        self._key = CONTEXT_KEY if version == 2 else UTTERANCE_KEY
        self._sender = WebSocketSender(ws, settings.send_timeout_s)
        self._running: dict[str, _Running] = {}  # the utterances under way, by id
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
                if message is _CONTEXTS:
                    assert isinstance(self.session, ContextSession)
                    await self._apply(self.session.expire(loop.time(), self._waiting))
                    continue
                receiving = None
                if message["type"] == "websocket.disconnect":
                    return
                parsed = self._parse(message.get("text"))
                if not isinstance(parsed, Invalid):
                    self._idle_since = loop.time()  # junk frames keep nothing open
                if isinstance(parsed, list):
                    await self._apply(parsed)
                else:
                    await self._apply(self.session.receive(parsed, loop.time()))
        except ClientGone:
            return
        finally:
            if receiving is not None:
                await cancel_and_wait(receiving)
            for running in list(self._running.values()):
                if running.task is not None:
                    await cancel_and_wait(running.task)
            self.service.metrics.active.labels("ws").dec()

    # --- what an endpoint on the same rules does otherwise (`gateway.twilio.connection`) --------

    def _parse(self, text: str | None) -> ClientMessage | list[Action]:
        """A client frame: a message for the session, or actions of the endpoint's own."""
        return parse_client_message(text, self.version)

    async def _audio(self, utterance_id: str, data: bytes) -> None:
        """An utterance's audio: a binary frame with its id."""
        await self._sender.send(audio_frame(utterance_id, data))

    async def _sent(self, utterance_id: str, event: Event) -> None:
        """An utterance's event (not audio) has been sent."""

    async def _cancelling(self, utterance_id: str) -> None:
        """A cancel for the utterance came; it is stopped next."""

    def _ended(self, utterance_id: str) -> None:
        """The utterance's task has ended, however (its reply done, refused, failed, stopped)."""

    # --- the loop's own ---------------------------------------------------------------------------

    def _playing(self) -> bool:
        """A reply is producing audio (not one waiting for the client's own text)."""
        return any(running.playing() for running in self._running.values())

    def _waiting(self, utterance_id: str) -> bool:
        """Whether the utterance waits for its client's text, with nothing to synthesize."""
        running = self._running.get(utterance_id)
        return running is None or not running.playing()

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
        well-formed message for `idle_timeout_s`, counted again from a reply's end); in
        protocol 2, `_CONTEXTS` when a context may have been idle too long."""
        loop = asyncio.get_running_loop()
        draining = asyncio.ensure_future(self.service.gate.draining.wait())
        try:
            while True:
                if self._dropped:
                    return _DROPPED
                now = loop.time()
                if now >= self._expires_at:
                    return _EXPIRED
                contexts_at = (
                    self.session.expires_at()
                    if isinstance(self.session, ContextSession)
                    else math.inf
                )
                if now >= contexts_at:
                    return _CONTEXTS
                playing = self._playing()
                waits: set[asyncio.Future[Any]] = {receiving}
                for running in self._running.values():
                    if running.task is not None and not running.task.done():
                        waits.add(running.task)  # its end, or its drop
                deadline = min(self._expires_at, contexts_at)
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
        await self._apply([SendError(error, self.session.utterance_id, self._key)])
        await self._sender.close(1000, "idle timeout")

    async def _end(self, close_code: int, code: str, said: str, status: int) -> None:
        """An error frame saying why, then the close with `code` as its reason."""
        error = GatewayError(f"{said}: closing", code=code, status=status)
        await self._apply([SendError(error, self.session.utterance_id, self._key)])
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
                case FeedText(delta=delta, utterance_id=uid):
                    await self._feed(uid, delta)
                case EndText(utterance_id=uid):
                    running = self._running.get(uid)
                    if running is not None:
                        if running.client_text is not None:
                            running.client_text.end()
                        running.early_end = True
                case CancelUtterance(utterance_id=uid, played_ms=played):
                    await self._cancelling(uid)
                    speech = await self._stop(uid)
                    self.service.metrics.cancels.inc()
                    heard = None if played is None or speech is None else speech.heard(played)
                    await self._apply(self.session.utterance_cancelled(uid, played, heard))
                case ExpireContext(context_id=cid):
                    assert isinstance(self.session, ContextSession)
                    await self._stop(cid)
                    await self._apply(self.session.context_expired(cid))
                case CloseConnection():
                    await self._sender.close(1000)

    async def _feed(self, uid: str, item: str | FlushMark) -> None:
        """The client's text (or a flush) for utterance `uid`: into its reply's queue, or,
        while it is being admitted, kept for it (as many as the queue takes)."""
        running = self._running.get(uid)
        if running is None:
            return  # it ended meanwhile (refused, failed or dropped): nobody reads
        source = running.client_text
        if source is None:
            if running.started.is_set():
                return  # refused
            if len(running.early) < MAX_PENDING:
                running.early.append(item)
                return
            error = self._queue_full(MAX_PENDING)
        elif source.closed or source.offer(item):  # closed: nobody reads
            return
        else:
            error = self._queue_full(source.max_pending)
        await self._apply([SendError(error, uid if self.version == 2 else None, self._key)])

    async def _stop(self, uid: str) -> Speech | None:
        """Stop utterance `uid` (its source and TTS stream closed) and wait until it has."""
        running = self._running.get(uid)
        if running is None:
            return None
        if running.task is not None:
            await cancel_and_wait(running.task)
        self._running.pop(uid, None)
        return running.speech

    def _queue_full(self, max_pending: int) -> GatewayError:
        return GatewayError(
            f"{max_pending} text deltas are waiting to be spoken, the limit: this delta "
            "was dropped; send fewer, larger deltas",
            code="text_queue_full",
            status=429,
            retryable=True,
        )

    async def _start(self, start: StartUtterance) -> None:
        """Run the utterance in a task of its own; protocol 1 waits until it has started (or
        was refused), so the next message finds it, and until the one before has ended."""
        uid = start.utterance_id
        if self.version == 1:  # the last reply has ended: let its task finish
            await self._finished()
        running = _Running(uid)
        self._running[uid] = running
        running.task = asyncio.create_task(self._utterance(start, running), name=f"ws-{uid}")
        if self.version == 1:
            await running.started.wait()

    async def _finished(self) -> None:
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    async def _utterance(self, start: StartUtterance, running: _Running) -> None:
        """Admit the utterance, then send its reply's events to the client until it ends.
        Refused: an error frame, and the session stays. A client that takes no frame in time
        is dropped: the reply stops, its client text is closed and the connection ends
        (`_next` sees `_dropped`)."""
        uid = start.utterance_id
        try:
            async with contextlib.AsyncExitStack() as speaking:
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
                            buffering=start.buffering,
                        )
                    )
                except ServiceError as exc:
                    # the session forgets it before protocol 1 reads on: text that follows a
                    # refused speak is answered `no_open_utterance`, as it always was
                    self._running.pop(uid, None)
                    await self._apply(self.session.start_failed(uid, exc))
                    running.started.set()
                    return
                running.speech, running.client_text = speech, speech.client_text
                self._take_early(running)
                running.started.set()
                await self._forward(speech)
        except ClientGone:
            self._dropped = True
            self.session.utterance_ended(uid, "", failed=True)
        finally:
            running.started.set()
            if self._running.get(uid) is running:
                del self._running[uid]
            self._ended(uid)

    def _take_early(self, running: _Running) -> None:
        """What the client sent while the utterance was being admitted goes to its reply."""
        source = running.client_text
        if source is None:
            return
        for item in running.early:
            source.offer(item)  # as many as the queue takes: `_feed` kept no more
        running.early.clear()
        if running.early_end:
            source.end()

    async def _forward(self, speech: Speech) -> None:
        """Send the reply's events to the client until it ends."""
        uid = speech.utterance_id
        key = self._key
        spoken: list[str] = []
        failed = False
        async for event in speech:
            if isinstance(event, AudioChunk):
                await self._audio(uid, event.data)
                continue
            if isinstance(event, TextDelta):
                spoken.append(event.text)
            failed = failed or isinstance(event, ErrorEvent)
            if isinstance(event, AgentEnd):
                await self._apply(self.session.utterance_ended(uid, "".join(spoken), failed))
            await self._sender.send(event_frame(event, uid, key))
            await self._sent(uid, event)
