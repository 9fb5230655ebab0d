"""The unit admission counts: one reply's asked-for synthesis on a model server (`Ask`).

A reply counts on its server by what it asks of the engine, not by its existence: from admission
until it ends, except while it waits, with nothing asked, for text its client sends (a WebSocket
`speak` with no text yet), when it counts for nothing. An ask is either starting (nothing sent
yet: its text unknown, a typical reply's work ahead) or under way, with the spare time of each
chunk it has still to come. A gateway's admission weighs a server's asks against its `/load`
answer (`kokoro_contract.load`) to take or refuse a new reply (`gateway.routing.admission`).

This is the value that work which changes what is counted extends: a batch of replies in one
engine call is still one ask per reply; one WebSocket with several contexts asks once per
context that has text; gateways that share one model server share their asks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Self

# of one chunk still to come: (how much later it could be ready without a gap in its reply's
# playback, seconds of synthesis from now until it is done)
Spare = tuple[float, float]


@dataclass(frozen=True)
class Ask:
    """One reply's asked-for synthesis at one moment. `chunks`: the spare time of each chunk
    it has still to come, in order (empty: all of it synthesized, while its playback runs);
    None while it is starting."""

    chunks: tuple[Spare, ...] | None = None

    @classmethod
    def under_way(cls, chunks: Iterable[Spare] = ()) -> Self:
        """A reply that has sent text, with the spare time of each chunk it has still to come."""
        return cls(tuple(chunks))

    @property
    def starting(self) -> bool:
        """Whether it has sent nothing yet (its text, and so its spare time, unknown)."""
        return self.chunks is None
