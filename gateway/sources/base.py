"""Text sources: each yields the answer's text as it is written (deltas). What a source can do
besides (take the client's text, say why it ended, ...) its kind declares in
`gateway.sources.registry`."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

FlushId = str | int  # a client's name for one of its flushes, given back as it came


@dataclass(frozen=True)
class FlushMark:
    """Where a client flushed its text (the speak WebSocket's protocol 2): everything before
    it is final and goes to synthesis now; `flush_id`, when given, is acknowledged
    (`gateway.reply.events.Flushed`) once the reply's audio up to here has been sent."""

    flush_id: FlushId | None = None


class TextSource(Protocol):
    """Streams one answer's text. Closing the generator closes the upstream. Only the client's
    own text (`gateway.sources.client`) carries `FlushMark`s between its deltas."""

    def stream(self) -> AsyncGenerator[str | FlushMark]: ...
