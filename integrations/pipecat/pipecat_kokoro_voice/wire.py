"""The gateway's speak WebSocket (`/v1/speak/ws`) as this client speaks it, sans I/O.

`UtteranceQueue` holds the rule the gateway enforces (one utterance at a time per connection:
a `speak` while one plays is refused `busy`) on the client's side: pipecat may open the next
context while the last one's audio is still arriving, so a context's utterance waits in the
queue, its text held, until the one before it has ended (`agent_end`, `cancelled`, or an
error that refused it). Its methods take what happened and return the messages to send now,
in order; `audio` says whose a binary frame is. While there is no connection nothing is sent:
text and flushes are held, and go out with their `speak` once `connected()` (a flush that
finds no socket is not lost). An utterance sent, or queued on an open connection, is the
gateway's to end (`carries`): however long the gateway is quiet, only its word or the
connection's loss ends it. The messages, audio frames and the rule for which errors end an
utterance are `kokoro_voice_client`'s, shared with the LiveKit plugin.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from kokoro_voice_client import ends_utterance, split_audio_frame
from kokoro_voice_client import speak_ws as msg
from kokoro_voice_client.errors import CLOSING
from kokoro_voice_client.speak_ws import MAX_ID_CHARS, SAMPLE_RATE, Message

_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")


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


@dataclass(frozen=True)
class Voice:
    """What a `speak` asks for: taken from the service's settings when the context opens, and
    the rate the pipeline plays at."""

    voice: str | None
    speed: float
    sample_rate: int = SAMPLE_RATE


def speak_message(utterance_id: str, voice: Voice) -> Message:
    return msg.speak(utterance_id, voice.voice, voice.speed, sample_rate=voice.sample_rate)


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
    def __init__(self, *, online: bool = True) -> None:
        """`online`: a connection is open (else nothing goes out until `connected()`)."""
        self.online = online
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

    def carries(self, context_id: str) -> bool:
        """The context's utterance is the gateway's to end: on the wire, or queued behind the
        one playing on an open connection, and not being cancelled. It ends at the gateway's
        word (`agent_end`, `cancelled`, an error that refuses it) or with its connection,
        never because the gateway has been quiet for a while. One held while there is no
        connection is not: nothing may ever carry it."""
        found = self._find(context_id)
        return found is not None and not found.cancelling and (found.sent or self.online)

    def on_wire(self) -> list[str]:
        """The contexts whose utterance went out and has not ended (nor is being cancelled):
        what losing the connection now would cut short."""
        return [u.context_id for u in self._queue if u.sent and not u.cancelling]

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
        return [msg.text(delta)]

    def flush(self, context_id: str) -> list[Message]:
        """The context's text is complete."""
        utterance = self._find(context_id)
        if utterance is None or utterance.flushed:
            return []
        utterance.flushed = True
        if not utterance.sent:
            return []
        utterance.sent_after_speak += 1
        return [msg.FLUSH]

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
        return [msg.cancel(played_ms)]

    def connection_lost(self, *, keep_unsent: bool = False) -> list[str]:
        """The socket went: the utterance on it is gone with it, and with `keep_unsent` false
        (pipecat closed their audio contexts) those queued behind it too; the rest wait for
        `connected()`. The contexts that are over."""
        self.online = False
        lost = [u for u in self._queue if u.sent or not keep_unsent]
        for utterance in lost:
            self._queue.remove(utterance)
        contexts = [u.context_id for u in lost]
        self._over.extend(contexts)
        self._stray_cancels = self._stray_texts = 0
        return contexts

    def connected(self) -> list[Message]:
        """A socket is open: the next utterance's speak, its held text and flush."""
        self.online = True
        return self._send_head()

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
        if code in CLOSING:  # the connection closes: `connection_lost` ends what it carried
            return True, None
        if code == "nothing_to_cancel" and self._stray_cancels:
            self._stray_cancels -= 1
            return False, None
        if code == "no_open_utterance" and self._stray_texts:
            self._stray_texts -= 1
            return False, None
        head = self._head()
        if head is None or head.answered:
            return True, None
        if not ends_utterance(body, head.utterance_id, answered=False):
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
        if head is None or head.sent or not self.online:
            return []
        head.sent = True
        messages = [speak_message(head.utterance_id, head.voice)]
        messages += [msg.text(delta) for delta in head.held]
        head.held = []
        if head.flushed:
            messages.append(msg.FLUSH)
        head.sent_after_speak = len(messages) - 1
        return messages
