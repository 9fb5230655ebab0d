"""Test-side helpers for the model server's bidirectional WebSocket."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.client import ClientConnection

TERMINAL = {"synthesis_complete", "synthesis_cancelled", "error"}


@dataclass
class Reply:
    events: list[dict[str, Any]] = field(default_factory=list)
    pcm: bytearray = field(default_factory=bytearray)
    frames: int = 0

    @property
    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    @property
    def last(self) -> dict[str, Any]:
        return self.events[-1]


async def read_until_terminal(ws: ClientConnection, request_id: str | None = None) -> Reply:
    """Read frames until a terminal event (for `request_id`, when given)."""
    reply = Reply()
    async for frame in ws:
        if isinstance(frame, bytes):
            reply.pcm += frame
            reply.frames += 1
            continue
        event = orjson.loads(frame)
        reply.events.append(event)
        if event["type"] in TERMINAL and request_id in (None, event.get("request_id")):
            return reply
    raise AssertionError(f"connection closed before a terminal event: {reply.types}")


def synth(text: str, request_id: str, **extra: Any) -> bytes:
    return orjson.dumps({"text": text, "request_id": request_id, **extra})
