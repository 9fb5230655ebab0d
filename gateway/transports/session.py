"""One pipelined synthesis session, independent of how frames travel (model-server WebSocket,
SageMaker bidirectional stream): chunks go out as model-server protocol messages the moment they
are ready; frames coming back are demultiplexed by the frame rule (a JSON object is control,
anything else is audio) and tracked until every chunk sent is complete."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson

from gateway.errors import TTSError
from model_server.protocol import parse_control

_INPUT_DONE = object()


class PipelinedSession:
    def __init__(
        self, send_frame: Callable[[str], Awaitable[None]], voice: str | None, speed: float
    ) -> None:
        self._send_frame = send_frame
        self._voice = voice
        self._speed = speed
        self._prefix = uuid.uuid4().hex[:12]
        self._counter = itertools.count()
        self._pending: set[str] = set()
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.request_ids: list[str] = []

    # --- for the reply ----------------------------------------------------------------------

    async def send(self, text: str) -> None:
        rid = f"{self._prefix}-{next(self._counter)}"
        message: dict[str, Any] = {"text": text, "speed": self._speed, "request_id": rid}
        if self._voice:
            message["voice"] = self._voice
        self._pending.add(rid)
        self.request_ids.append(rid)
        await self._send_frame(orjson.dumps(message).decode())

    async def end_input(self) -> None:
        await self._inbox.put(_INPUT_DONE)

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
        await self._send_frame('{"type": "cancel"}')

    async def close(self) -> None:
        await self._send_frame('{"type": "close"}')

    # --- for the reader that receives frames ------------------------------------------------

    async def received(self, frame: bytes | str) -> None:
        await self._inbox.put(frame)

    async def failed(self, error: TTSError) -> None:
        await self._inbox.put(error)
