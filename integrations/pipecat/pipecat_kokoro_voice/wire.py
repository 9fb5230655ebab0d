"""The gateway's speak WebSocket, protocol 2 (`/v1/speak/ws?protocol=2`), as this client speaks
it, sans I/O.

`ContextTable` is one socket's table of contexts: each pipecat context (a turn) is one gateway
context under the same id (made safe, `utterance_id_for`), opened with a `speak` the moment its
first text comes, however many others are still playing: the gateway plays contexts side by
side, so nothing waits in a queue here, and a barge-in's next turn goes out before the old
context's `cancelled`. Its methods take what happened and return the messages to send now, in
order; `audio` says whose a binary frame is (by its context id prefix). While there is no
connection nothing is sent: a context's text and its end are held, and go out with its `speak`
once `connected()` (an end that finds no socket is not lost). A context sent, or opened on an
open connection, is the gateway's to end (`carries`): however long the gateway is quiet, only
its word (`agent_end`, `cancelled`, `context_closed`, an error that refuses it) or the
connection's loss ends it. The messages, audio frames and the rule for which errors end a
context are `kokoro_voice_client`'s.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from kokoro_voice_client import ends_context, split_audio_frame
from kokoro_voice_client import speak_ws as msg
from kokoro_voice_client.errors import CLOSING
from kokoro_voice_client.speak_ws import MAX_ID_CHARS, SAMPLE_RATE, Message

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
# what the gateway answers a message for a context it no longer holds (one that ended, or was
# refused, while the message was on its way): expected for a context that is over here
_GONE = frozenset({"unknown_context", "context_not_open"})


def utterance_id_for(context_id: str, taken: set[str] | None = None) -> str:
    """The context id as the gateway's: 1-64 characters of `[A-Za-z0-9_.:-]` (anything else
    becomes `_`); one already in `taken` gets a `.n` suffix, so ids stay unique."""
    base = _UNSAFE.sub("_", context_id)[:MAX_ID_CHARS] or "utterance"
    candidate, n = base, 1
    while taken is not None and candidate in taken:
        n += 1
        suffix = f".{n}"
        candidate = base[: MAX_ID_CHARS - len(suffix)] + suffix
    return candidate


@dataclass(frozen=True)
class Voice:
    """What a `speak` asks for: taken from the service's settings when the context opens, and
    the rate the pipeline plays at."""

    voice: str | None
    speed: float
    sample_rate: int = SAMPLE_RATE


def speak_message(wire_id: str, voice: Voice) -> Message:
    return msg.speak_context(wire_id, voice.voice, voice.speed, sample_rate=voice.sample_rate)


@dataclass
class _Context:
    context_id: str  # pipecat's
    wire_id: str  # the gateway's (pipecat's, made safe)
    voice: Voice
    held: list[str] = field(default_factory=list)  # text before its speak went out
    closed: bool = False  # its text is complete (`close_context`)
    sent: bool = False  # its speak went out
    answered: bool = False  # the gateway sent an event or audio of its reply (it started)
    cancelling: bool = False  # a cancel went out; `cancelled` ends it
    odd_byte: bytes = b""  # half a sample, carried to the next binary frame


@dataclass(frozen=True)
class Ended:
    """A context is over: it gets no more audio. `cancelled`: a cancel ended it (pipecat has
    dropped its audio context already)."""

    context_id: str
    cancelled: bool


class ContextTable:
    """One socket's contexts, by pipecat's id and by the gateway's (`wire_id`)."""

    def __init__(self, *, online: bool = True) -> None:
        """`online`: a connection is open (else nothing goes out until `connected()`)."""
        self.online = online
        self._contexts: dict[str, _Context] = {}  # by pipecat's id, in the order they opened
        self._by_wire: dict[str, _Context] = {}
        self._ids: set[str] = set()  # every wire id used, so none is reused
        self._over: deque[str] = deque(maxlen=256)  # pipecat's ids of contexts that ended
        self._over_wire: deque[str] = deque(maxlen=256)  # and their wire ids

    @property
    def open(self) -> list[str]:
        """The contexts not yet ended, oldest first (pipecat's ids)."""
        return list(self._contexts)

    def wire_id(self, context_id: str) -> str | None:
        found = self._contexts.get(context_id)
        return found.wire_id if found is not None else None

    def carries(self, context_id: str) -> bool:
        """The context is the gateway's to end: its speak went out, or it opened on an open
        connection, and it is not being cancelled. It ends at the gateway's word, never
        because the gateway has been quiet for a while. One held while there is no connection
        is not: nothing may ever carry it."""
        found = self._contexts.get(context_id)
        return found is not None and not found.cancelling and (found.sent or self.online)

    def on_wire(self) -> list[str]:
        """The contexts whose speak went out and that have not ended (nor are being
        cancelled): what losing the connection now would cut short."""
        return [c.context_id for c in self._contexts.values() if c.sent and not c.cancelling]

    # --- what pipecat does ------------------------------------------------------------------

    def text(self, context_id: str, delta: str, voice: Voice) -> list[Message]:
        """Text for a context: a new one (its `speak` goes out at once, beside any playing)
        or more of it."""
        context = self._contexts.get(context_id)
        if context is None:
            if context_id in self._over:
                return []  # refused, cancelled or ended: its text has nowhere to go
            context = _Context(context_id, utterance_id_for(context_id, self._ids), voice)
            self._ids.add(context.wire_id)
            self._contexts[context_id] = context
            self._by_wire[context.wire_id] = context
        if context.closed or context.cancelling:
            return []
        if not context.sent:
            context.held.append(delta)
            return self._send(context)
        return [msg.context_text(context.wire_id, delta)]

    def close(self, context_id: str) -> list[Message]:
        """The context's text is complete (pipecat's flush of it): `close_context`."""
        context = self._contexts.get(context_id)
        if context is None or context.closed or context.cancelling:
            return []
        context.closed = True
        if not context.sent:
            return []  # goes out with its speak
        return [msg.close_context(context.wire_id)]

    def cancel(self, context_id: str, played_ms: float | None = None) -> list[Message]:
        """Barge-in: a context never sent is dropped; one on the wire is cancelled (with how
        much of it was heard, when known) and ends at `cancelled`. Other contexts, and the
        next one to open, go on at once."""
        context = self._contexts.get(context_id)
        if context is None or context.cancelling:
            return []
        if not context.sent:
            self._forget(context)
            return []
        context.cancelling = True
        return [msg.cancel_context(context.wire_id, played_ms)]

    def connection_lost(self, *, keep_unsent: bool = False) -> list[str]:
        """The socket went: the contexts on it are gone with it, and with `keep_unsent` false
        (pipecat closed their audio contexts) those never sent too; the rest wait for
        `connected()`. The contexts that are over."""
        self.online = False
        lost = [c for c in self._contexts.values() if c.sent or not keep_unsent]
        for context in lost:
            self._forget(context)
        return [c.context_id for c in lost]

    def connected(self) -> list[Message]:
        """A socket is open: each held context's speak, its text and its end, in the order
        they opened."""
        self.online = True
        return [m for c in list(self._contexts.values()) for m in self._send(c)]

    # --- what the gateway sends -------------------------------------------------------------

    def audio(self, frame: bytes) -> tuple[str, bytes] | None:
        """The context a binary frame's audio is for and the whole samples in it, or None when
        it belongs to no context playing (a cancelled one's late audio, or unknown).
        ValueError for a frame shorter than its id."""
        wire_id, pcm = split_audio_frame(frame)
        context = self._by_wire.get(wire_id)
        if context is None or context.cancelling:
            return None
        context.answered = True
        pcm = context.odd_byte + pcm
        cut = len(pcm) - len(pcm) % 2
        context.odd_byte = pcm[cut:]
        return context.context_id, pcm[:cut]

    def owner(self, wire_id: object) -> str | None:
        """The context an event names (its `context_id`), while it plays (not once
        cancelled)."""
        context = self._by_wire.get(wire_id) if isinstance(wire_id, str) else None
        if context is None or context.cancelling:
            return None
        context.answered = True
        return context.context_id

    def ended(self, wire_id: object) -> Ended | None:
        """`agent_end`, `cancelled` or `context_closed` naming `wire_id`: it is over (a
        cancelled one however it ended)."""
        context = self._by_wire.get(wire_id) if isinstance(wire_id, str) else None
        if context is None:
            return None
        return self._end(context)

    def error(self, body: Message) -> tuple[bool, Ended | None]:
        """An error frame: whether to report it, and the context it ended. An error refusing a
        context's `speak` ends it (reported, unless it was being cancelled); what the gateway
        answers the text, end or cancel of a context that was already over (`unknown_context`,
        `context_not_open`: they crossed its end, or its refusal) is expected, not reported;
        an error during a reply does not end it (its `agent_end` follows)."""
        code = body.get("code")
        if code in CLOSING:  # the connection closes: `connection_lost` ends what it carried
            return True, None
        wire_id = body.get(msg.CONTEXT_KEY)
        context = self._by_wire.get(wire_id) if isinstance(wire_id, str) else None
        if context is None:
            crossed = code in _GONE and wire_id in self._over_wire
            return not crossed, None
        if not ends_context(body, context.wire_id, context.answered):
            return True, None
        # `unknown_context` for a context here: its speak was refused by an error that could
        # not name it (reported when it came), or it ended as its cancel went out
        report = not context.cancelling and (code not in _GONE or context.answered)
        return report, self._end(context)

    def not_protocol_2(self, body: Message) -> list[Ended]:
        """An error frame that says the gateway does not speak protocol 2 (`unknown_type`,
        naming no context: a gateway before it took `?protocol=2` for protocol 1, refused
        every `speak` and answers `close_context` so), which ends every context sent: none
        will ever be answered. Otherwise nothing."""
        if body.get("code") != "unknown_type" or body.get(msg.CONTEXT_KEY) is not None:
            return []
        return [self._end(c) for c in list(self._contexts.values()) if c.sent]

    # --- the table --------------------------------------------------------------------------

    def _send(self, context: _Context) -> list[Message]:
        if context.sent or not self.online:
            return []
        context.sent = True
        messages = [speak_message(context.wire_id, context.voice)]
        messages += [msg.context_text(context.wire_id, delta) for delta in context.held]
        context.held = []
        if context.closed:
            messages.append(msg.close_context(context.wire_id))
        return messages

    def _end(self, context: _Context) -> Ended:
        self._forget(context)
        return Ended(context.context_id, context.cancelling)

    def _forget(self, context: _Context) -> None:
        del self._contexts[context.context_id]
        del self._by_wire[context.wire_id]
        self._over.append(context.context_id)
        self._over_wire.append(context.wire_id)
