"""What a chunk plan is to the reply that runs it: the chunks it decides (`Chunk`), the inputs
and questions every plan answers (`Plan`), and those a plan that holds the listener's playback
answers too (`Playback`: the pipeline's playback processor and admission ask them). Both plans
keep to `UNFINISHED_MAX`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# chunks a reply may have at the model server, unfinished: a model server's --max-pending is at
# least this (its default is 32)
UNFINISHED_MAX = 4


@dataclass(frozen=True)
class Chunk:
    text: str
    deadline_ms: float | None  # from now: when its first audio is needed (None: no deadline)


class Playback(Protocol):
    """A plan that holds the listener's playback until what follows can keep up, and so knows
    how much spare time the chunks still to come have (`spare_profile`, which admission reads:
    this is `gateway.routing.admission.InProgress`, and more)."""

    @property
    def started(self) -> bool:
        """Whether a chunk has gone to the engine."""
        ...

    def audio_ready(self, now: float) -> None:
        """Audio has come back from the model server."""
        ...

    def audio_started(self, now: float) -> None:
        """The reply's first audio went to the listener: playback starts."""
        ...

    def release_at(self, now: float) -> float | None:
        """When the first audio, ready, should go to the listener; None: now (playback has
        started, or nothing was sent)."""
        ...

    def spare_profile(self, now: float) -> tuple[tuple[float, float], ...]:
        """(how much later it could be ready without a gap, seconds of synthesis from now until
        it is done) of each chunk still to come, in order; empty when nothing is left."""
        ...


class Plan(Protocol):
    """Where a reply's streamed text is cut and when each piece goes to the model server. Time
    is the caller's clock in seconds (`now`); a plan reads no clock and never sleeps."""

    def push(self, text: str, now: float) -> list[Chunk]:
        """More text: the chunks to send now."""
        ...

    def flush(self, now: float) -> list[Chunk]:
        """The text has ended: the chunks to send now."""
        ...

    def cut(self, now: float) -> list[Chunk]:
        """The client flushed (the speak WebSocket's protocol 2): the text so far is final,
        whatever sentence it ends in, and more may follow: the chunks to send now."""
        ...

    def tick(self, now: float) -> list[Chunk]:
        """Its time (`wake_at`), or a chunk completed: the chunks to send now."""
        ...

    def wake_at(self) -> float | None:
        """When to `tick` if no text or report comes first; None: only text or a report moves
        it on."""
        ...

    def completed(
        self,
        index: int,
        audio_s: float,
        now: float,
        synth_s: float | None = None,
        first_s: float | None = None,
        early_s: float | None = None,
    ) -> None:
        """Chunk `index` finished at the model server: how long it plays, took to synthesize
        and to give its first audio, and how much audio its first frame held (None: not
        reported)."""
        ...

    @property
    def unsent(self) -> bool:
        """Whether final text waits to be sent."""
        ...

    @property
    def asking(self) -> bool:
        """Whether the reply asks the engine for synthesis now, or is about to."""
        ...

    @property
    def playback(self) -> Playback | None:
        """The plan as it holds the listener's playback; None: it never holds it (its chunks
        have no deadlines, and so no spare time to tell)."""
        ...
