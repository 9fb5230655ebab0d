"""WS /invocations-bidirectional-stream: one long-lived session, many utterances.

The session reads and synthesizes concurrently: messages (new requests, cancels) are handled
while a synthesis runs; requests are answered strictly in arrival order. Every engine call goes
through the shared scheduler, so no session holds the model for longer than one segment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from model_server import protocol
from model_server.errors import ServiceError
from model_server.protocol import Cancel, Close, ProtocolError, SynthesisRequest
from model_server.service import ModelService
from model_server.ws_sender import ClientGone, WebSocketSender

log = logging.getLogger(__name__)
router = APIRouter()


class BidiSession:
    def __init__(self, ws: WebSocket, service: ModelService) -> None:
        self.ws = ws
        self.service = service
        self.key = object()
        self._queue: deque[SynthesisRequest] = deque()
        self._wakeup = asyncio.Event()
        self._current: tuple[SynthesisRequest, asyncio.Task[None]] | None = None
        self._sender = WebSocketSender(ws)

    # --- I/O --------------------------------------------------------------------------------

    async def _send(self, data: str | bytes) -> None:
        await self._sender.send(data)

    async def run(self) -> None:
        close_requested = False
        try:
            async with asyncio.TaskGroup() as tg:
                worker = tg.create_task(self._work())
                try:
                    close_requested = await self._read()
                finally:
                    worker.cancel()
        except* ClientGone:
            pass
        if close_requested and self.ws.application_state is WebSocketState.CONNECTED:
            with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                await self.ws.close(1000)  # the client may already be gone

    async def _read(self) -> bool:
        """Handle client messages until close (True) or disconnect (False)."""
        while True:
            message = await self.ws.receive()
            if message["type"] == "websocket.disconnect":
                return False
            data = message.get("bytes")
            if data is None:
                data = message.get("text", "")
            if await self._handle(data):
                return True

    # --- messages ---------------------------------------------------------------------------

    async def _handle(self, data: str | bytes) -> bool:
        try:
            rules = self.service.get().rules
        except ServiceError as exc:
            await self._send(protocol.error_event(exc.code, exc.message))
            return False
        msg = protocol.parse_client_message(data, rules)
        match msg:
            case ProtocolError():
                await self._send(msg.event())
            case SynthesisRequest():
                await self._submit(msg)
            case Cancel(request_id=rid):
                await self._cancel(rid)
            case Close():
                return True
        return False

    def _pending_ids(self) -> set[str]:
        ids = {r.request_id for r in self._queue}
        if self._current is not None:
            ids.add(self._current[0].request_id)
        return ids

    async def _submit(self, req: SynthesisRequest) -> None:
        pending = self._pending_ids()
        if req.request_id in pending:
            await self._send(
                protocol.error_event(
                    "duplicate_request_id",
                    f"request {req.request_id!r} is already queued or running",
                    req.request_id,
                )
            )
        elif len(pending) >= self.service.settings.max_pending:
            await self._send(
                protocol.error_event(
                    "too_many_pending",
                    f"{len(pending)} requests are already pending on this session; "
                    "wait for one to complete",
                    req.request_id,
                )
            )
        else:
            self._queue.append(req)
            self._wakeup.set()

    async def _cancel(self, request_id: str | None) -> None:
        queued = [r for r in self._queue if request_id in (None, r.request_id)]
        for req in queued:
            self._queue.remove(req)
            await self._send(protocol.cancelled_event(req.request_id))
        current = self._current
        if current is not None and request_id in (None, current[0].request_id):
            current[1].cancel()  # the worker answers synthesis_cancelled
        elif request_id is not None and not queued:
            await self._send(
                protocol.error_event(
                    "unknown_request_id",
                    f"no queued or running request {request_id!r}",
                    request_id,
                )
            )

    # --- synthesis --------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            while not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
            req = self._queue.popleft()
            task = asyncio.create_task(self._synthesize(req))
            self._current = (req, task)
            try:
                await task
            except asyncio.CancelledError:
                this = asyncio.current_task()
                if this is not None and this.cancelling():
                    raise  # the session is ending, not just this request
                await self._send(protocol.cancelled_event(req.request_id))
            finally:
                self._current = None

    async def _synthesize(self, req: SynthesisRequest) -> None:
        synthesizer = self.service.get().synthesizer
        started = time.perf_counter()
        await self._send(protocol.start_event(req.request_id))
        sent = 0
        try:
            async for pcm in synthesizer.stream(req, self.key):
                await self._send(pcm)
                sent += len(pcm)
        except ClientGone:
            raise
        except ServiceError as exc:
            await self._send(protocol.error_event(exc.code, exc.message, req.request_id))
            return
        except Exception:
            log.exception("synthesis of request %s failed", req.request_id)
            await self._send(
                protocol.error_event(
                    "synthesis_failed", "synthesis failed on the server", req.request_id
                )
            )
            return
        elapsed = time.perf_counter() - started
        await self._send(protocol.complete_event(req.request_id, sent, elapsed))


@router.websocket("/invocations-bidirectional-stream")
async def bidirectional_stream(ws: WebSocket) -> None:
    await ws.accept()
    await BidiSession(ws, ws.app.state.service).run()
