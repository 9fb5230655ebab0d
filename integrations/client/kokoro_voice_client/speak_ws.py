"""The speak WebSocket (`/v1/speak/ws`) as a client speaks it, pure: the messages it sends and
the binary audio frames it reads (docs/protocols.md, "WebSocket /v1/speak/ws").

Two protocols: 1 (the default: one utterance at a time; `speak`, `text`, `FLUSH`, `cancel`)
and 2 (`/v1/speak/ws?protocol=2`, `urls.speak_ws_url(url, protocol=2)`: several contexts on one
socket, every message naming its context; `speak_context`, `context_text`, `flush_context`,
`close_context`, `cancel_context`). Audio frames are the same in both, prefixed with the
utterance's or the context's id."""

from __future__ import annotations

import json
from typing import Any

SAMPLE_RATE = 24_000
# the rates the gateway speaks `pcm` at (its `sample_rate`; 24000, the model's, by default)
PCM_RATES = (8_000, 16_000, 22_050, SAMPLE_RATE, 44_100, 48_000)
NUM_CHANNELS = 1
BYTES_PER_SECOND = SAMPLE_RATE * 2 * NUM_CHANNELS  # s16le
MAX_ID_CHARS = 64

Message = dict[str, Any]
"""One client message, a JSON object."""


def speak(
    utterance_id: str,
    voice: str | None = None,
    speed: float = 1.0,
    *,
    timestamps: bool = True,
    audio_format: str = "pcm",
    sample_rate: int = SAMPLE_RATE,
) -> Message:
    """`speak` with no text: the client streams it (`text` deltas, then `flush`), `bidi`, with
    `words` frames when `timestamps`; no `voice`: the gateway's default; `sample_rate` named
    only when it is not the model's own (a gateway before it knew the field takes the rest)."""
    message: Message = {
        "type": "speak",
        "utterance_id": utterance_id,
        "mode": "bidi",
        "format": audio_format,
        "speed": speed,
        "timestamps": timestamps,
    }
    if voice:
        message["voice"] = voice
    if sample_rate != SAMPLE_RATE:
        message["sample_rate"] = sample_rate
    return message


def text(delta: str) -> Message:
    return {"type": "text", "delta": delta}


FLUSH: Message = {"type": "flush"}
CLOSE: Message = {"type": "close"}


def cancel(played_ms: float | None = None) -> Message:
    """Barge-in; with `played_ms` (how much the listener heard) the gateway answers with the
    words heard by then."""
    message: Message = {"type": "cancel"}
    if played_ms is not None:
        message["played_ms"] = max(0, round(played_ms))
    return message


# --- protocol 2: several contexts on one socket ------------------------------------------------

PROTOCOL_2 = 2
CONTEXT_KEY = "context_id"
"""What names a context in protocol 2's messages and events (never `utterance_id`)."""


def speak_context(
    context_id: str,
    voice: str | None = None,
    speed: float = 1.0,
    *,
    timestamps: bool = True,
    audio_format: str = "pcm",
    sample_rate: int = SAMPLE_RATE,
    buffering: str | None = None,
) -> Message:
    """Protocol 2's `speak`: opens context `context_id` (1-64 characters of `[A-Za-z0-9_.:-]`)
    with no text (the client streams it: `context_text`, then `close_context`), as protocol 1's
    `speak` does; `buffering` ("gateway", the default, or "client") named only when given."""
    fields = speak(
        context_id,
        voice,
        speed,
        timestamps=timestamps,
        audio_format=audio_format,
        sample_rate=sample_rate,
    )
    del fields["utterance_id"]
    message: Message = {**fields, CONTEXT_KEY: context_id}
    if buffering is not None:
        message["buffering"] = buffering
    return message


def context_text(context_id: str, delta: str) -> Message:
    """More text for a context opened without any."""
    return {"type": "text", CONTEXT_KEY: context_id, "delta": delta}


def flush_context(context_id: str, flush_id: str | int | None = None) -> Message:
    """Synthesize the context's text so far; it stays open. With `flush_id` the gateway answers
    `flushed` once that audio has been sent."""
    message: Message = {"type": "flush", CONTEXT_KEY: context_id}
    if flush_id is not None:
        message["flush_id"] = flush_id
    return message


def close_context(context_id: str) -> Message:
    """No more text for the context (protocol 1's flush): it ends once its audio has."""
    return {"type": "close_context", CONTEXT_KEY: context_id}


def cancel_context(context_id: str, played_ms: float | None = None) -> Message:
    """Barge-in on that context alone (answered `cancelled` naming it); `played_ms` as
    protocol 1's `cancel`."""
    message: Message = {"type": "cancel", CONTEXT_KEY: context_id}
    if played_ms is not None:
        message["played_ms"] = max(0, round(played_ms))
    return message


def encode(message: Message) -> str:
    """A message as its text frame."""
    return json.dumps(message)


def split_audio_frame(frame: bytes) -> tuple[str, bytes]:
    """A binary frame: byte 0 is n, bytes 1..n the utterance id (protocol 2: the context id;
    ASCII), the rest the audio
    (24 kHz s16 mono PCM for `format: pcm`). ValueError for a frame shorter than its id."""
    if not frame:
        raise ValueError("an empty audio frame")
    n = frame[0]
    if len(frame) < 1 + n:
        raise ValueError(f"an audio frame shorter than its utterance id ({len(frame)} bytes)")
    return frame[1 : 1 + n].decode("ascii", errors="replace"), frame[1 + n :]
