"""`echo`: speaks the request's text, optionally paced like an LLM for demos and benchmarks."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator

_TOKEN = re.compile(r"\S+\s*|\s+")


def tokens(text: str) -> list[str]:
    """One token per word with its trailing whitespace (leading whitespace is its own)."""
    return _TOKEN.findall(text)


class EchoSource:
    def __init__(self, text: str, tps: float = 0.0, first_ms: float = 0.0) -> None:
        self.text = text
        self.tps = tps
        self.first_ms = first_ms

    async def stream(self) -> AsyncIterator[str]:
        if self.tps <= 0 and self.first_ms <= 0:
            yield self.text
            return
        loop = asyncio.get_running_loop()
        start = loop.time() + self.first_ms / 1000
        interval = 1 / self.tps if self.tps > 0 else 0.0
        for i, token in enumerate(tokens(self.text)):
            # pace against the clock, not by accumulating sleeps, so drift does not build up
            delay = start + i * interval - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            yield token
