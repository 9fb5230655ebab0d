"""When a client's flush is acknowledged, pure: a flush (`sources.base.FlushMark`) is answered
once the reply's audio up to it has been sent to the client.

The reply tells this record four things, in the order they happen:
- `text(chars)`: text went to the plan (its characters that are not white space: the plan
  cuts and strips white space only, so what was pushed and what the chunks carry agree);
- `flush(flush_id)`: the client flushed; the flush covers every character pushed so far;
- `sent(chars)`: the next chunk went to the model server (chunk indices count from 0);
- `completed(index, pieces)`: chunk `index` is done at the model server, and by then `pieces`
  pieces of the stream had come back (its audio is all among them: the TTS stream tells a
  chunk's completion after the last of its audio);
and asks `due(emitted)`: the flushes, in the order they came, whose audio is all among the
first `emitted` pieces given to the client. A flush is due when the chunk holding its last
character is complete and its pieces are emitted; a flush that covers nothing new (before any
text, or twice in a row) is due as soon as the one before it is. Flushes are answered in
their order, never one before an earlier one.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from gateway.sources.base import FlushId


def spoken_chars(text: str) -> int:
    """The characters of `text` that count: white space is cut and stripped at will."""
    return sum(not c.isspace() for c in text)


@dataclass(frozen=True)
class _Pending:
    flush_id: FlushId | None
    chars: int  # every character pushed before it


class FlushAcks:
    def __init__(self) -> None:
        self._pushed = 0  # characters pushed to the plan
        self._sent_ends: list[int] = []  # each chunk sent: characters up to its end
        self._boundaries: dict[int, int] = {}  # a completed chunk: pieces up to its end
        self._pending: deque[_Pending] = deque()

    @property
    def waiting(self) -> bool:
        """Whether a flush is waiting to be answered."""
        return bool(self._pending)

    def text(self, chars: int) -> None:
        self._pushed += chars

    def flush(self, flush_id: FlushId | None) -> None:
        self._pending.append(_Pending(flush_id, self._pushed))

    def sent(self, chars: int) -> None:
        before = self._sent_ends[-1] if self._sent_ends else 0
        self._sent_ends.append(before + chars)

    def completed(self, index: int, pieces: int) -> None:
        self._boundaries.setdefault(index, pieces)

    def due(self, emitted: int) -> list[FlushId | None]:
        """The flushes now answered, in order (a flush without an id among them: the caller
        says nothing for it)."""
        out: list[FlushId | None] = []
        while self._pending and self._covered(self._pending[0].chars, emitted):
            out.append(self._pending.popleft().flush_id)
        return out

    def rest(self) -> list[FlushId | None]:
        """Every flush still waiting: the reply ended with all its audio sent."""
        out = [p.flush_id for p in self._pending]
        self._pending.clear()
        return out

    def _covered(self, chars: int, emitted: int) -> bool:
        if chars == 0:
            return True
        for index, end in enumerate(self._sent_ends):
            if end >= chars:  # the chunk holding the flush's last character
                boundary = self._boundaries.get(index)
                return boundary is not None and boundary <= emitted
        return False  # not all of it sent yet
