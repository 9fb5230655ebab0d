"""WS /invocations-bidirectional-stream: the I/O around `BidiSession`.

Messages are read while a synthesis runs (cancels take effect at once); the session core
decides what to send and what to start or abort, this adapter does it. Every engine call goes
through the shared scheduler, so no session holds the model for longer than one segment.

At most `--max-sessions` sessions are open at once: one more is told `too_many_sessions` and
closed with 1013 (try again later). A session with nothing queued or running that sends no
message for `--idle-timeout-s` is told `idle_timeout` and closed with 1000.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from kokoro_contract import protocol
from kokoro_contract.errors import ServiceError
from kokoro_contract.protocol import ErrorMsg, SynthesisRequest, WordTimingsMsg
from kokoro_contract.ws_sender import ClientGone, WebSocketSender
from model_server.bidi_session import (
    AbortSynthesis,
    Action,
    BidiSession,
    CloseSession,
    Send,
    StartSynthesis,
)
from model_server.service import ModelService

log = logging.getLogger(__name__)
router = APIRouter()


class BidiConnection:
    def __init__(self, ws: WebSocket, service: ModelService) -> None:
        self.ws = ws
        self.service = service
        self.session = BidiSession(service.settings.max_pending)
        self.key = object()  # this connection's turns in the scheduler
        self._sender = WebSocketSender(ws)
        self._steps = asyncio.Lock()  # one core step's frames go out together, in order
        self._received: dict[str, float] = {}  # request id -> arrival, for its deadline
        # the running synthesis, started by the core's step and awaited by the worker
        self._running: asyncio.Task[tuple[int, float]] | None = None
        self._started: asyncio.Queue[tuple[str, asyncio.Task[tuple[int, float]]]] = asyncio.Queue(1)
        self._idle: asyncio.Timeout | None = None  # the wait for the next message

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                worker = tg.create_task(self._work())
                try:
                    await self._read()
                finally:
                    worker.cancel()
        except* ClientGone:
            pass
        finally:
            if self._running is not None:  # started, but the worker never took it
                self._running.cancel()
                await asyncio.wait([self._running])
        if self.session.closed and self.ws.application_state is WebSocketState.CONNECTED:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await self.ws.close(1000)  # the client may already be gone

    def _arm_idle(self) -> None:
        """The wait for the next message ends `--idle-timeout-s` from now while nothing is
        queued or running (and never while something is)."""
        idle_s = self.service.settings.idle_timeout_s
        if self._idle is None or not idle_s:
            return
        busy = bool(self.session.pending_ids) or self._running is not None
        self._idle.reschedule(None if busy else asyncio.get_running_loop().time() + idle_s)

    async def _read(self) -> None:
        """Client messages until close, disconnect or the idle timeout."""
        while not self.session.closed:
            try:
                async with asyncio.timeout(None) as self._idle:
                    self._arm_idle()
                    message = await self.ws.receive()
            except TimeoutError:
                idle_s = self.service.settings.idle_timeout_s
                error = ErrorMsg("idle_timeout", f"no request for {idle_s:.0f} s: closed")
                await self._sender.send(error.encode())
                with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                    await self.ws.close(1000, "idle_timeout")
                return
            finally:
                self._idle = None
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            if data is None:
                data = message.get("text", "")
            try:
                rules = self.service.get().rules
            except ServiceError as exc:
                await self._sender.send(ErrorMsg(exc.code, exc.message).encode())
                continue
            msg = protocol.parse_client_message(data, rules)
            if isinstance(msg, SynthesisRequest):
                self._received.setdefault(msg.request_id, time.perf_counter())
            async with self._steps:
                await self._apply(self.session.receive(msg))
            if len(self._received) > len(self.session.pending_ids):  # refused or cancelled
                pending = set(self.session.pending_ids)
                self._received = {r: t for r, t in self._received.items() if r in pending}

    async def _apply(self, actions: list[Action]) -> None:
        for action in actions:
            match action:
                case Send(frame=frame):
                    await self._sender.send(frame)
                case StartSynthesis(request=request):
                    received = self._received.pop(request.request_id, None)
                    self._running = asyncio.create_task(self._synthesize(request, received))
                    self._started.put_nowait((request.request_id, self._running))
                case AbortSynthesis():
                    if self._running is not None:
                        self._running.cancel()
                case CloseSession():
                    pass  # _read stops; run() closes with 1000

    async def _work(self) -> None:
        while True:
            rid, task = await self._started.get()
            try:
                sent, elapsed = await task
                outcome = self.session.synthesis_finished(rid, sent, elapsed)
            except asyncio.CancelledError:
                this = asyncio.current_task()
                if this is not None and this.cancelling():
                    raise  # the session is ending, not just this request
                outcome = self.session.synthesis_cancelled(rid)
            except ClientGone:
                raise
            except ServiceError as exc:
                outcome = self.session.synthesis_failed(rid, exc.code, exc.message)
            except Exception:
                log.exception("synthesis of request %s failed", rid)
                outcome = self.session.synthesis_failed(
                    rid, "synthesis_failed", "synthesis failed on the server"
                )
            finally:
                self._running = None
            async with self._steps:
                await self._apply(outcome)
            self._arm_idle()  # nothing left to do: the idle timeout counts from now

    async def _synthesize(
        self, request: SynthesisRequest, received: float | None
    ) -> tuple[int, float]:
        """Stream one request's audio frames; (bytes sent, seconds)."""
        synthesizer = self.service.get().synthesizer
        started = time.perf_counter()
        sent = 0
        async for chunk in synthesizer.stream_timed(request, self.key, received):
            if chunk.words is not None:  # with timestamps: the words before their audio
                await self._sender.send(WordTimingsMsg(request.request_id, chunk.words).encode())
            if chunk.pcm:  # (a progressive window may settle words and hold its audio back)
                await self._sender.send(chunk.pcm)
                sent += len(chunk.pcm)
        return sent, time.perf_counter() - started


@router.websocket(protocol.PATH)
async def bidirectional_stream(ws: WebSocket) -> None:
    await ws.accept()
    state = ws.app.state
    service: ModelService = state.service
    limit = service.settings.max_sessions
    if limit and state.bidi_sessions >= limit:
        message = f"this model server has {limit} sessions open, its limit: try again later"
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await ws.send_text(ErrorMsg("too_many_sessions", message).encode())
            await ws.close(1013, "too_many_sessions")
        return
    state.bidi_sessions += 1
    try:
        await BidiConnection(ws, service).run()
    finally:
        state.bidi_sessions -= 1
