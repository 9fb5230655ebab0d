"""The `sentences` plan, pure: the chunker alone, one chunk per sentence, no deadlines, playback
never held; and the plan of a client that decides where its text is cut (`client_plan`)."""

from __future__ import annotations

from typing import Protocol

from gateway.reply.chunker import ChunkerConfig, HeldText, IncrementalSentenceChunker
from gateway.reply.plan.protocol import UNFINISHED_MAX, Chunk, Plan, Playback


class Cutter(Protocol):
    """Where text is cut: `IncrementalSentenceChunker`, or `HeldText` (the client's flushes)."""

    def push(self, text: str) -> list[str]: ...

    def flush(self) -> list[str]: ...


class SentencePlan(Plan):
    """The `sentences` plan: every sentence (the first clause early) goes out the moment the
    chunker has it, with no deadline, one chunk each, while fewer than `UNFINISHED_MAX` are
    unfinished (later ones wait for a `completed`, which has the reply `tick` it: it never
    asks for a wake-up of its own); playback is never held (`playback` is None). The same
    inputs as `ChunkPlan`, so a reply runs either without knowing which."""

    def __init__(self, config: ChunkerConfig | None = None, cutter: Cutter | None = None) -> None:
        self._chunker = cutter or IncrementalSentenceChunker(config)
        self._units: list[str] = []  # final sentences not sent yet
        self._sent = 0
        self._done: set[int] = set()

    def push(self, text: str, now: float) -> list[Chunk]:
        self._units += self._chunker.push(text)
        return self._release()

    def flush(self, now: float) -> list[Chunk]:
        self._units += self._chunker.flush()
        return self._release()

    def cut(self, now: float) -> list[Chunk]:
        return self.flush(now)  # it never ends: more text may follow a flush

    def tick(self, now: float) -> list[Chunk]:
        return self._release()

    def _release(self) -> list[Chunk]:
        out: list[Chunk] = []
        while self._units and self._sent - len(self._done) < UNFINISHED_MAX:
            out.append(Chunk(self._units.pop(0), None))
            self._sent += 1
        return out

    @property
    def unsent(self) -> bool:
        """Whether final text waits to be sent (for a chunk to complete)."""
        return bool(self._units)

    @property
    def asking(self) -> bool:
        """Whether the reply asks the engine for synthesis now: a chunk there unfinished, or
        a sentence to send."""
        return bool(self._units) or self._sent > len(self._done)

    def wake_at(self) -> float | None:
        """None: what waits, waits for a report (text is sent the moment it is final)."""
        return None

    @property
    def playback(self) -> Playback | None:
        """None: its chunks have no deadlines; the first audio plays as soon as it is ready."""
        return None

    def completed(
        self,
        index: int,
        audio_s: float,
        now: float,
        synth_s: float | None = None,
        first_s: float | None = None,
        early_s: float | None = None,
    ) -> None:
        """Chunk `index` finished: one more may go (a report of it again changes nothing)."""
        self._done.add(index)


def client_plan(max_chars: int) -> SentencePlan:
    """`"buffering": "client"`: the text goes to synthesis when the client flushes (or ends
    it), as one chunk unless it is longer than `max_chars`; no deadlines, no hold."""
    return SentencePlan(cutter=HeldText(max_chars))
