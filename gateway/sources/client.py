"""Client-streamed text: the WebSocket client brings its own LLM and sends text deltas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

_END = object()


class ClientTextSource:
    def __init__(self, max_pending: int = 256) -> None:
        self._queue: asyncio.Queue[str | object] = asyncio.Queue(max_pending)
        self.ended = False

    async def put(self, delta: str) -> None:
        if self.ended:
            raise RuntimeError("text already flushed")
        await self._queue.put(delta)

    async def end(self) -> None:
        if not self.ended:
            self.ended = True
            await self._queue.put(_END)

    async def stream(self) -> AsyncGenerator[str]:
        while (item := await self._queue.get()) is not _END:
            assert isinstance(item, str)
            yield item
