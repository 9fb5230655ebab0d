"""`echo`: speaks the request's text, optionally paced like an LLM for demos and benchmarks."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncGenerator, Sequence

_TOKEN = re.compile(r"\S+\s*|\s+")


def tokens(text: str) -> list[str]:
    """One token per word with its trailing whitespace (leading whitespace is its own)."""
    return _TOKEN.findall(text)


async def paced[T](items: Sequence[T], tps: float, first_ms: float) -> AsyncGenerator[T]:
    """`items` at an LLM's pace: the first after `first_ms`, then `tps` per second (0: at once).
    Paced against the clock, not by accumulating sleeps, so drift does not build up."""
    loop = asyncio.get_running_loop()
    start = loop.time() + first_ms / 1000
    interval = 1 / tps if tps > 0 else 0.0
    for i, item in enumerate(items):
        delay = start + i * interval - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        yield item


class EchoSource:
    def __init__(self, text: str, tps: float = 0.0, first_ms: float = 0.0) -> None:
        self.text = text
        self.tps = tps
        self.first_ms = first_ms

    async def stream(self) -> AsyncGenerator[str]:
        if self.tps <= 0 and self.first_ms <= 0:
            yield self.text
            return
        async for token in paced(tokens(self.text), self.tps, self.first_ms):
            yield token
