"""The gateway's speak WebSocket (`/v1/speak/ws`) as this client speaks it, sans I/O.

`UtteranceQueue` holds the rule the gateway enforces (one utterance at a time per connection:
a `speak` while one plays is refused `busy`) on the client's side: pipecat may open the next
context while the last one's audio is still arriving, so a context's utterance waits in the
queue, its text held, until the one before it has ended (`agent_end`, `cancelled`, or an
error that refused it). Its methods take what happened and return the messages to send now,
in order; `audio` says whose a binary frame is.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

MAX_ID_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")

Message = dict[str, Any]
"""One client message, a JSON object."""

# errors without an utterance id that answer a `speak` which did not parse
_SPEAK_REFUSALS = frozenset({"invalid_field", "invalid_json", "not_an_object"})


def utterance_id_for(context_id: str, taken: set[str] | None = None) -> str:
    """The context id as an utterance id: 1-64 characters of `[A-Za-z0-9_.:-]` (anything else
    becomes `_`); one already in `taken` gets a `.n` suffix, so ids stay unique."""
    base = _UNSAFE.sub("_", context_id)[:MAX_ID_CHARS] or "utterance"
    candidate, n = base, 1
    while taken is not None and candidate in taken:
        n += 1
        suffix = f".{n}"
        candidate = base[: MAX_ID_CHARS - len(suffix)] + suffix
    return candidate


def split_audio_frame(frame: bytes) -> tuple[str, bytes]:
    """A binary frame's utterance id and audio: byte 0 is the id's length, then the id."""
    if not frame:
        raise ValueError("an empty binary frame")
    n = frame[0]
    if len(frame) < 1 + n:
        raise ValueError("a binary frame shorter than its utterance id")
    return frame[1 : 1 + n].decode("ascii", errors="replace"), frame[1 + n :]


@dataclass(frozen=True)
class Voice:
    """What a `speak` asks for: taken from the service's settings when the context opens."""

    voice: str | None
    speed: float


def speak_message(utterance_id: str, voice: Voice) -> Message:
    message: Message = {
        "type": "speak",
        "mode": "bidi",
        "format": "pcm",
        "speed": voice.speed,
        "timestamps": True,
        "utterance_id": utterance_id,
    }
    if voice.voice:
        message["voice"] = voice.voice
    return message


@dataclass
class _Utterance:
    context_id: str
    utterance_id: str
    voice: Voice
    held: list[str] = field(default_factory=list)  # text before its speak went out
    flushed: bool = False
    sent: bool = False  # its speak went out
    answered: bool = False  # the gateway sent an event of its reply (it started)
    cancelling: bool = False  # a cancel went out; `cancelled` ends it
    sent_after_speak: int = 0  # text and flush messages sent since its speak
    odd_byte: bytes = b""  # half a sample, carried to the next binary frame


@dataclass(frozen=True)
class Ended:
    """An utterance is over: its context gets no more audio. `messages`: what to send now
    (the next utterance's speak and held text)."""

    context_id: str
    cancelled: bool
    messages: list[Message]


class UtteranceQueue:
    def __init__(self) -> None:
        self._queue: deque[_Utterance] = deque()
        self._ids: set[str] = set()
        self._stray_cancels = 0  # cancels that will be answered `nothing_to_cancel`
        self._stray_texts = 0  # text and flush of a refused speak: `no_open_utterance`
        self._over: deque[str] = deque(maxlen=256)  # contexts whose utterance has ended

    @property
    def playing(self) -> str | None:
        """The context whose utterance is on the wire now."""
        head = self._head()
        return head.context_id if head is not None else None

    def utterance_id(self, context_id: str) -> str | None:
        found = self._find(context_id)
        return found.utterance_id if found is not None else None

    # --- what pipecat does ------------------------------------------------------------------

    def text(self, context_id: str, delta: str, voice: Voice) -> list[Message]:
        """Text for a context: a new utterance (queued behind the one playing) or more of it."""
        utterance = self._find(context_id)
        if utterance is None:
            if context_id in self._over:
                return []  # refused, cancelled or ended: its text has nowhere to go
            utterance = _Utterance(context_id, utterance_id_for(context_id, self._ids), voice)
            self._ids.add(utterance.utterance_id)
            self._queue.append(utterance)
        if utterance.flushed or utterance.cancelling:
            return []
        if not utterance.sent:
            utterance.held.append(delta)
            return self._send_head()
        utterance.sent_after_speak += 1
        return [{"type": "text", "delta": delta}]

    def flush(self, context_id: str) -> list[Message]:
        """The context's text is complete."""
        utterance = self._find(context_id)
        if utterance is None or utterance.flushed:
            return []
        utterance.flushed = True
        if not utterance.sent:
            return []
        utterance.sent_after_speak += 1
        return [{"type": "flush"}]

    def cancel(self, context_id: str, played_ms: float | None = None) -> list[Message]:
        """Barge-in: an utterance still queued is dropped; the one on the wire is cancelled
        (with how much of it was heard, when known) and ends at `cancelled`."""
        utterance = self._find(context_id)
        if utterance is None or utterance.cancelling:
            return []
        if not utterance.sent:
            self._queue.remove(utterance)
            self._over.append(context_id)
            return []
        utterance.cancelling = True
        message: Message = {"type": "cancel"}
        if played_ms is not None:
            message["played_ms"] = max(0, round(played_ms))
        return [message]

    def connection_lost(self) -> list[str]:
        """The socket went: every utterance is gone with it. Their contexts."""
        contexts = [u.context_id for u in self._queue]
        self._over.extend(contexts)
        self._queue.clear()
        self._stray_cancels = self._stray_texts = 0
        return contexts

    # --- what the gateway sends -------------------------------------------------------------

    def audio(self, frame: bytes) -> tuple[str, bytes] | None:
        """The context a binary frame's audio is for and the whole samples in it, or None when
        it belongs to no utterance playing (a cancelled one's late audio, or unknown)."""
        uid, pcm = split_audio_frame(frame)
        head = self._head()
        if head is None or head.utterance_id != uid or head.cancelling:
            return None
        pcm = head.odd_byte + pcm
        cut = len(pcm) - len(pcm) % 2
        head.odd_byte = pcm[cut:]
        return head.context_id, pcm[:cut]

    def owner(self, utterance_id: object) -> str | None:
        """The context of an event's utterance, while it plays (not once cancelled)."""
        head = self._head()
        if head is None or head.utterance_id != utterance_id or head.cancelling:
            return None
        head.answered = True
        return head.context_id

    def ended(self, utterance_id: object, *, by_cancel: bool = False) -> Ended | None:
        """`agent_end` or `cancelled` for `utterance_id`."""
        head = self._head()
        if head is None or head.utterance_id != utterance_id:
            return None
        if head.cancelling and not by_cancel:
            self._stray_cancels += 1  # the reply ended before the cancel reached it
        return self._end(head, cancelled=head.cancelling)

    def error(self, body: Message) -> tuple[bool, Ended | None]:
        """An error frame: whether to report it, and the utterance it ended. A refused
        `speak` (nothing was sent for it) ends its utterance, and the text already sent for
        it is answered `no_open_utterance`, expected, not reported; an error during a reply
        does not end it (its `agent_end` follows), nor does `nothing_to_cancel` answering a
        cancel that crossed the reply's end."""
        code = body.get("code")
        uid = body.get("utterance_id")
        if code == "nothing_to_cancel" and self._stray_cancels:
            self._stray_cancels -= 1
            return False, None
        if code == "no_open_utterance" and self._stray_texts:
            self._stray_texts -= 1
            return False, None
        head = self._head()
        if head is None or head.answered:
            return True, None
        refused = (uid is not None and uid == head.utterance_id and code != "text_too_long") or (
            uid is None and code in _SPEAK_REFUSALS  # the speak itself did not parse
        )
        if not refused:
            return True, None
        if head.cancelling:
            self._stray_cancels += 1
        self._stray_texts += head.sent_after_speak
        return not head.cancelling, self._end(head, cancelled=head.cancelling)

    # --- the queue --------------------------------------------------------------------------

    def _head(self) -> _Utterance | None:
        return self._queue[0] if self._queue else None

    def _find(self, context_id: str) -> _Utterance | None:
        for utterance in reversed(self._queue):
            if utterance.context_id == context_id:
                return utterance
        return None

    def _end(self, head: _Utterance, cancelled: bool) -> Ended:
        self._queue.popleft()
        self._over.append(head.context_id)
        return Ended(head.context_id, cancelled, self._send_head())

    def _send_head(self) -> list[Message]:
        head = self._head()
        if head is None or head.sent:
            return []
        head.sent = True
        messages = [speak_message(head.utterance_id, head.voice)]
        messages += [{"type": "text", "delta": delta} for delta in head.held]
        head.held = []
        if head.flushed:
            messages.append({"type": "flush"})
        head.sent_after_speak = len(messages) - 1
        return messages
