"""The speak WebSocket (`/v1/speak/ws`) as a client speaks it, pure: the messages it sends and
the binary audio frames it reads (docs/protocols.md, "WebSocket /v1/speak/ws")."""

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


def encode(message: Message) -> str:
    """A message as its text frame."""
    return json.dumps(message)


def split_audio_frame(frame: bytes) -> tuple[str, bytes]:
    """A binary frame: byte 0 is n, bytes 1..n the utterance id (ASCII), the rest the audio
    (24 kHz s16 mono PCM for `format: pcm`). ValueError for a frame shorter than its id."""
    if not frame:
        raise ValueError("an empty audio frame")
    n = frame[0]
    if len(frame) < 1 + n:
        raise ValueError(f"an audio frame shorter than its utterance id ({len(frame)} bytes)")
    return frame[1 : 1 + n].decode("ascii", errors="replace"), frame[1 + n :]
