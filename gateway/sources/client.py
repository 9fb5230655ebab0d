"""Client-streamed text: the WebSocket client brings its own LLM and sends text deltas.

The deltas wait in a bounded queue for the reply to take them; nothing that feeds it ever
waits: `offer` refuses a delta (or a flush mark) when the queue is full (the connection answers
`text_queue_full`), `end` and `close` always have room. `close` is for a reply that was dropped:
what was queued is forgotten and the reader, if any, ends. A flush mark (protocol 2's `flush`)
goes in order between the deltas: the reply sends what came before it to synthesis.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from gateway.sources.base import FlushMark

_END = object()
MAX_PENDING = 256  # deltas not yet taken by the reply


class ClientTextSource:
    def __init__(self, max_pending: int = MAX_PENDING) -> None:
        self.max_pending = max_pending
        # one slot more than the deltas may take: the end always fits
        self._queue: asyncio.Queue[str | FlushMark | object] = asyncio.Queue(max_pending + 1)
        self.ended = False  # flushed, or closed
        self.closed = False  # its reply is gone: nothing reads it any more

    def offer(self, delta: str | FlushMark) -> bool:
        """Queue `delta` (or a flush mark); False (and it dropped) when `max_pending` wait.
        Never after `end` or `close`."""
        if self.ended:
            raise RuntimeError("text already flushed")
        if self._queue.qsize() >= self.max_pending:
            return False
        self._queue.put_nowait(delta)
        return True

    def end(self) -> None:
        """No more text: the reply speaks what is queued, then ends."""
        if not self.ended:
            self.ended = True
            self._queue.put_nowait(_END)

    def close(self) -> None:
        """The reply is gone: forget what is queued; a reader still there ends."""
        if self.closed:
            return
        while not self._queue.empty():
            self._queue.get_nowait()
        self.ended = self.closed = True
        self._queue.put_nowait(_END)

    async def stream(self) -> AsyncGenerator[str | FlushMark]:
        while (item := await self._queue.get()) is not _END:
            assert isinstance(item, str | FlushMark)
            yield item
