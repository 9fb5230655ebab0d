"""`WS /v1/twilio/ws?stream_sid=...`, pure: a voice's G.711 mu-law audio in, Twilio's own
bidirectional Media Streams messages out, paced at real time; Twilio's messages (which the agent
forwards) in, typed, with what their marks say about playback. No I/O and no clock: time comes
in as `now`, seconds on any clock that does not go back (the endpoint's `loop.time()`).

To Twilio (JSON text; the agent relays them verbatim on the call's stream):
    {"event": "media", "streamSid": sid, "media": {"payload": base64}}   one 20 ms frame each
    {"event": "mark", "streamSid": sid, "mark": {"name": utterance_id}}  after an utterance's
                                                                         last frame
    {"event": "clear", "streamSid": sid}                                 barge-in
From Twilio, forwarded by the agent: `connected`, `start`, `media`, `dtmf`, `stop` (accepted,
nothing to do) and `mark`, the echo of ours once the phone has played everything before it.
Any other event, or a message naming another stream, is refused (`Invalid`, never raised).

The endpoint's loop, with `stream = TwilioStream(stream_sid)`:
    the encoder's audio of utterance U  -> stream.audio(U, data)
    U's audio has ended                 -> stream.utterance_end(U)
    barge-in (the agent's cancel)       -> send(stream.barge_in())
    a Twilio message from the agent     -> stream.received(text): `Invalid` -> an error frame;
                                           `UtterancePlayed` / `UtteranceCleared` -> playback
    after each of these, and whenever `stream.due_at()` comes (None: nothing to send; a time
    already past: at once)              -> for text in stream.send_now(now): send(text)

Rules:
- Framing: audio comes in pieces of any length; it goes out as whole 20 ms frames of 160 bytes
  (8000 Hz, a byte a sample). The remainder waits for the utterance's next piece; at its end it
  is padded with mu-law silence (0xFF, the code of sample 0) to a whole frame.
- Pacing: frames leave at real time with a lead: the audio sent ahead of what the phone has
  played (as reckoned from when frames were sent) never passes `lead_s`. So a fresh stream sends
  the lead's worth of frames at once, then one every 20 ms. When everything sent has played
  out (the stream ran dry: a pause, a slow synthesis) the clock starts again from the next
  frame: a pause earns no burst beyond the lead. Marks cost no time: one leaves with the frame
  before it.
- Marks: one after each utterance's last frame, named by its utterance id (ids are unique on a
  stream: the endpoint gives each utterance its own). Its echo means the phone played the whole
  utterance: its audio is added to `played_ms`. An echo naming no mark awaiting one is refused.
- Barge-in: `barge_in()` drops every queued frame and mark and the remainder, restarts the
  pacer's clock (Twilio's buffer is emptied by the `clear` it returns), and marks every
  utterance not yet played as cleared: its late audio and end are ignored. Twilio sends back the
  marks a `clear` empties from its buffer; those echoes are `UtteranceCleared`, not played.
  (An echo of a mark that did play, still on its way when the barge-in came, is counted as
  cleared too: from here the two cannot be told apart.)
"""

from __future__ import annotations

import base64
import binascii
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import BadRequest
from gateway.speak_ws.protocol import Invalid  # a message not one of Twilio's, or not this stream's
from kokoro_contract.errors import ServiceError

SAMPLE_RATE = 8000  # Twilio's audio/x-mulaw: 8000 Hz, mono, a byte a sample
FRAME_BYTES = 160  # 20 ms
FRAME_S = FRAME_BYTES / SAMPLE_RATE
MULAW_SILENCE = 0xFF  # G.711 mu-law's code for the sample 0
# 10 frames. Twilio plays what it was sent from its own buffer, so a lead rides out the jitter
# of two WebSocket hops (gateway -> agent -> Twilio) without the phone falling silent; what is
# buffered ahead is also what a barge-in must throw away, and only the `clear` reaching Twilio
# does that: audio an agent relays ahead of it (its own queue, a clear sent out of band) still
# plays. 200 ms covers ordinary jitter and keeps that tail to a syllable.
DEFAULT_LEAD_S = 0.2
_EPS_S = 1e-6  # times this close count as equal (floats of `now` and of 0.02 s steps)


# --- to Twilio ----------------------------------------------------------------------------------


def _dump(body: dict[str, Any]) -> str:
    return orjson.dumps(body).decode()


def media_message(stream_sid: str, audio: bytes) -> str:
    """A `media` message: `audio`, mu-law at 8000 Hz, base64 in its payload."""
    payload = base64.b64encode(audio).decode("ascii")
    return _dump({"event": "media", "streamSid": stream_sid, "media": {"payload": payload}})


def mark_message(stream_sid: str, name: str) -> str:
    """A `mark`: Twilio echoes it once the phone has played all the audio sent before it."""
    return _dump({"event": "mark", "streamSid": stream_sid, "mark": {"name": name}})


def clear_message(stream_sid: str) -> str:
    """A `clear`: Twilio drops the audio it holds and sends back the marks among it."""
    return _dump({"event": "clear", "streamSid": stream_sid})


# --- from Twilio --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Connected:
    protocol: str | None
    version: str | None


@dataclass(frozen=True)
class Start:
    stream_sid: str
    call_sid: str | None


@dataclass(frozen=True)
class Media:
    stream_sid: str
    payload: bytes  # mu-law, 8000 Hz
    track: str | None  # "inbound" from Twilio; absent in the media sent to it


@dataclass(frozen=True)
class Dtmf:
    stream_sid: str
    digit: str | None


@dataclass(frozen=True)
class Stop:
    stream_sid: str


@dataclass(frozen=True)
class Mark:
    stream_sid: str
    name: str
    sequence_number: int | None


TwilioMessage = Connected | Start | Media | Dtmf | Stop | Mark
EVENTS = ("connected", "start", "media", "dtmf", "stop", "mark")


def parse_twilio_message(data: str | bytes | dict[str, Any]) -> TwilioMessage | Invalid:
    """One of Twilio's Media Streams messages: its JSON text, or the object already decoded (an
    endpoint that tells `{"event": ...}` from its own `{"type": ...}` messages decodes once).
    Every message but `connected` names its stream (`streamSid`); a `mark` its name."""
    if isinstance(data, dict):
        msg = data
    else:
        try:
            msg = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            return Invalid(BadRequest(f"message is not JSON: {exc}", code="invalid_json"))
        if not isinstance(msg, dict):
            return Invalid(BadRequest("message must be a JSON object", code="not_an_object"))
    event = msg.get("event")
    try:
        match event:
            case "connected":
                return Connected(_opt_str(msg, "protocol"), _opt_str(msg, "version"))
            case "start":
                start = _opt_object(msg, "start")
                return Start(_stream_sid(msg), _opt_str(start, "callSid", "start.callSid"))
            case "media":
                media = _object(msg, "media")
                return Media(
                    _stream_sid(msg),
                    _base64(media.get("payload"), "media.payload"),
                    _opt_str(media, "track", "media.track"),
                )
            case "dtmf":
                dtmf = _opt_object(msg, "dtmf")
                return Dtmf(_stream_sid(msg), _opt_str(dtmf, "digit", "dtmf.digit"))
            case "stop":
                return Stop(_stream_sid(msg))
            case "mark":
                name = _object(msg, "mark").get("name")
                if not isinstance(name, str):
                    raise _invalid("'mark.name' must be a string")
                return Mark(_stream_sid(msg), name, _sequence_number(msg.get("sequenceNumber")))
    except ServiceError as exc:
        return Invalid(exc)
    return Invalid(
        BadRequest(
            f"unknown Twilio event {event!r}; expected one of {', '.join(EVENTS)}",
            code="unknown_event",
        )
    )


def _invalid(message: str) -> BadRequest:
    return BadRequest(message, code="invalid_field")


def _stream_sid(msg: dict[str, Any]) -> str:
    sid = msg.get("streamSid")
    if not isinstance(sid, str) or not sid:
        raise _invalid("'streamSid' must be a non-empty string")
    return sid


def _opt_str(msg: dict[str, Any], key: str, path: str | None = None) -> str | None:
    value = msg.get(key)
    if value is not None and not isinstance(value, str):
        raise _invalid(f"'{path or key}' must be a string")
    return value


def _object(msg: dict[str, Any], key: str) -> dict[str, Any]:
    value = msg.get(key)
    if not isinstance(value, dict):
        raise _invalid(f"'{key}' must be an object")
    return value


def _opt_object(msg: dict[str, Any], key: str) -> dict[str, Any]:
    return {} if msg.get(key) is None else _object(msg, key)


def _base64(value: object, path: str) -> bytes:
    if not isinstance(value, str):
        raise _invalid(f"'{path}' must be a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise _invalid(f"'{path}' is not base64: {exc}") from exc


def _sequence_number(value: object) -> int | None:
    """Twilio sends it as a string of digits."""
    if value is None:
        return None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise _invalid("'sequenceNumber' must be a string of digits")


# --- framing and pacing -------------------------------------------------------------------------


class MulawFramer:
    """Mu-law bytes in pieces of any length -> whole 160-byte (20 ms) frames; the remainder waits
    for the next piece. `flush()` at an utterance's end pads it with silence (0xFF) to a frame;
    `clear()` drops it."""

    def __init__(self) -> None:
        self._rest = bytearray()

    @property
    def pending(self) -> int:
        """Bytes waiting for a whole frame."""
        return len(self._rest)

    def push(self, data: bytes) -> list[bytes]:
        self._rest += data
        whole = len(self._rest) - len(self._rest) % FRAME_BYTES
        frames = [bytes(self._rest[i : i + FRAME_BYTES]) for i in range(0, whole, FRAME_BYTES)]
        del self._rest[:whole]
        return frames

    def flush(self) -> list[bytes]:
        if not self._rest:
            return []
        frame = bytes(self._rest) + bytes([MULAW_SILENCE]) * (FRAME_BYTES - len(self._rest))
        self._rest.clear()
        return [frame]

    def clear(self) -> None:
        self._rest.clear()


class Pacer:
    """When 20 ms frames may leave: the audio sent ahead of real time stays within `lead_s`.

    The clock starts with the first frame sent (`origin`); frame k (from 0) has played by
    `origin + (k + 1) * 0.02`, so with `sent` frames out, one more may go once
    `origin + (sent + 1) * 0.02 <= now + lead_s`: the lead's worth at once, then one per 20 ms.
    Once all that was sent has played (`now >= origin + sent * 0.02`: the far end's buffer ran
    dry) the clock starts again at the next frame, so a gap earns no burst beyond the lead.
    `lead_s` is at least one frame (0.02 s): else nothing could ever be sent ahead of its time.
    """

    def __init__(self, lead_s: float = DEFAULT_LEAD_S) -> None:
        if not math.isfinite(lead_s) or lead_s < FRAME_S - _EPS_S:
            raise ValueError(f"lead_s must be at least one frame ({FRAME_S} s), not {lead_s}")
        self.lead_s = lead_s
        self._origin: float | None = None
        self._sent = 0  # frames sent since origin

    @property
    def lead_frames(self) -> int:
        """Frames a fresh (or dry) stream may send at once."""
        return math.floor((self.lead_s + _EPS_S) / FRAME_S)

    def take(self, now: float, queued: int) -> int:
        """How many of `queued` frames may go at `now`; they count as sent."""
        if queued <= 0:
            return 0
        if self._origin is None or now >= self._origin + self._sent * FRAME_S:
            self._origin, self._sent = now, 0  # a fresh start, or the stream ran dry
        allowed = math.floor((now - self._origin + self.lead_s + _EPS_S) / FRAME_S) - self._sent
        n = max(0, min(queued, allowed))
        self._sent += n
        return n

    def due_at(self) -> float:
        """When the next frame may go: `-inf` (at once) before the first frame or after `clear()`;
        a time already past when the stream has run dry."""
        if self._origin is None:
            return -math.inf
        return self._origin + (self._sent + 1) * FRAME_S - self.lead_s

    def clear(self) -> None:
        """Nothing is buffered at the far end any more: the next frame starts the clock."""
        self._origin, self._sent = None, 0


# --- the stream ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class UtterancePlayed:
    """A mark came back: the phone has played the utterance to its end."""

    utterance_id: str
    audio_ms: float  # the utterance's audio (its last frame's padding not counted)
    played_ms: float  # the stream's played position, with it


@dataclass(frozen=True)
class UtteranceCleared:
    """A mark came back for an utterance a barge-in cleared: Twilio returns the marks a `clear`
    drops, so this says nothing of how much of it was heard (at most `sent_ms`)."""

    utterance_id: str
    sent_ms: float


Received = Connected | Start | Media | Dtmf | Stop | UtterancePlayed | UtteranceCleared | Invalid


@dataclass(frozen=True)
class UtteranceState:
    utterance_id: str
    sent_ms: float  # its audio sent to Twilio (its last frame's padding not counted)
    ended: bool  # `utterance_end` came
    played: bool  # its mark came back: the phone played it to its end
    cleared: bool  # a barge-in dropped what was left of it


@dataclass
class _Utterance:
    utterance_id: str
    sent_samples: int = 0
    ended: bool = False
    mark_sent: bool = False
    echoed: bool = False
    cleared: bool = False


@dataclass(frozen=True)
class _Frame:
    utterance: _Utterance
    data: bytes
    samples: int  # the utterance's own samples in it (less than 160 in a padded last frame)


@dataclass(frozen=True)
class _Mark:
    utterance: _Utterance


def _ms(samples: int) -> float:
    return samples * 1000 / SAMPLE_RATE


class TwilioStream:
    """One Twilio media stream's outbound voice: utterances' audio in, paced messages out, and
    the marks' echoes in (see the module's docstring for the rules). Utterances come one at a
    time: audio of another utterance while one is open (neither ended nor cleared) is the
    caller's mistake (`ValueError`), as is an id used twice."""

    def __init__(self, stream_sid: str, lead_s: float = DEFAULT_LEAD_S) -> None:
        if not stream_sid:
            raise ValueError("stream_sid must not be empty")
        self.stream_sid = stream_sid
        self._framer = MulawFramer()
        self._pacer = Pacer(lead_s)
        self._queue: deque[_Frame | _Mark] = deque()
        self._queued_frames = 0
        self._utterances: dict[str, _Utterance] = {}
        self._open: _Utterance | None = None
        self._played_samples = 0

    @property
    def lead_s(self) -> float:
        return self._pacer.lead_s

    @property
    def played_ms(self) -> float:
        """Audio the phone has played: the utterances whose marks came back, whole."""
        return _ms(self._played_samples)

    def utterance(self, utterance_id: str) -> UtteranceState | None:
        u = self._utterances.get(utterance_id)
        if u is None:
            return None
        played = u.echoed and not u.cleared
        return UtteranceState(u.utterance_id, _ms(u.sent_samples), u.ended, played, u.cleared)

    # --- the voice ------------------------------------------------------------------------------

    def audio(self, utterance_id: str, mulaw: bytes) -> None:
        """Queue an utterance's mu-law audio (8000 Hz), a piece of any length; a cleared
        utterance's late audio is dropped."""
        u = self._opened(utterance_id)
        if u is None:
            return
        for frame in self._framer.push(mulaw):
            self._queue.append(_Frame(u, frame, FRAME_BYTES))
            self._queued_frames += 1

    def utterance_end(self, utterance_id: str) -> None:
        """The utterance's audio has ended: its last frame padded, then its mark. An utterance
        without audio gets its mark alone. A cleared utterance's end is ignored."""
        u = self._opened(utterance_id)
        if u is None:
            return
        samples = self._framer.pending
        for frame in self._framer.flush():
            self._queue.append(_Frame(u, frame, samples))
            self._queued_frames += 1
        self._queue.append(_Mark(u))
        u.ended = True
        self._open = None

    def _opened(self, utterance_id: str) -> _Utterance | None:
        u = self._utterances.get(utterance_id)
        if u is not None and u.cleared:
            return None  # late audio of a barged-in utterance
        if u is not None and u.ended:
            raise ValueError(f"utterance {utterance_id!r} has ended: give each its own id")
        if self._open is not None and self._open.utterance_id != utterance_id:
            raise ValueError(
                f"utterance {self._open.utterance_id!r} is still open: end it before "
                f"{utterance_id!r}"
            )
        if u is None:
            u = self._open = self._utterances[utterance_id] = _Utterance(utterance_id)
        return u

    def barge_in(self) -> str:
        """Drop everything queued and the remainder, and clear Twilio's buffer: the `clear`
        message to send. Every utterance not yet played counts as cleared."""
        self._queue.clear()
        self._queued_frames = 0
        self._framer.clear()
        self._pacer.clear()
        self._open = None
        for u in self._utterances.values():
            if not u.echoed:
                u.cleared = True
        return clear_message(self.stream_sid)

    # --- sending --------------------------------------------------------------------------------

    def send_now(self, now: float) -> list[str]:
        """The messages due at `now`, in order: frames as the pacer allows, each mark with the
        frame before it."""
        budget = self._pacer.take(now, self._queued_frames)
        out: list[str] = []
        while self._queue:
            item = self._queue[0]
            if isinstance(item, _Mark):
                item.utterance.mark_sent = True
                out.append(mark_message(self.stream_sid, item.utterance.utterance_id))
            elif budget > 0:
                budget -= 1
                self._queued_frames -= 1
                item.utterance.sent_samples += item.samples
                out.append(media_message(self.stream_sid, item.data))
            else:
                break
            self._queue.popleft()
        return out

    def due_at(self) -> float | None:
        """When `send_now` has something to send: None, nothing queued; else a time, already
        past (or `-inf`) when it is due at once. Right after `send_now(now)`: None or after
        `now`."""
        if not self._queue:
            return None
        if isinstance(self._queue[0], _Mark):
            return -math.inf
        return self._pacer.due_at()

    # --- from Twilio ----------------------------------------------------------------------------

    def received(self, data: str | bytes | dict[str, Any]) -> Received:
        """A Twilio message the agent forwarded: its mark echoes as playback, the rest as
        parsed; a message of another stream, or an echo of no mark awaiting one, `Invalid`."""
        msg = parse_twilio_message(data)
        if isinstance(msg, Invalid | Connected):
            return msg
        if msg.stream_sid != self.stream_sid:
            error = BadRequest(
                f"streamSid {msg.stream_sid!r} is not this stream's ({self.stream_sid!r})",
                code="foreign_stream",
            )
            return Invalid(error)
        if isinstance(msg, Mark):
            return self._echo(msg.name)
        return msg

    def _echo(self, name: str) -> UtterancePlayed | UtteranceCleared | Invalid:
        u = self._utterances.get(name)
        if u is None or not u.mark_sent or u.echoed:
            error = BadRequest(
                f"no mark named {name!r} is awaiting its echo on this stream",
                code="unknown_mark",
            )
            return Invalid(error)
        u.echoed = True
        if u.cleared:
            return UtteranceCleared(name, _ms(u.sent_samples))
        self._played_samples += u.sent_samples
        return UtterancePlayed(name, _ms(u.sent_samples), self.played_ms)
