"""The events of one reply, the same for every transport (SSE, WebSocket) and mode."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from gateway.sources.base import FlushId
from kokoro_contract.protocol import WordTiming


@dataclass(frozen=True)
class AgentStart:
    mode: str
    utterance_id: str
    name = "agent_start"


@dataclass(frozen=True)
class TextDelta:
    seq: int
    text: str
    name = "text_delta"


@dataclass(frozen=True)
class AudioStreamStart:
    format: str
    mime: str
    voice: str
    sample_rate: int
    name = "audio_stream_start"


@dataclass(frozen=True)
class AudioChunk:
    seq: int
    data: bytes
    name = "audio_chunk"


@dataclass(frozen=True)
class Words:
    """Word timings for audio that follows: milliseconds from the utterance's first sample."""

    words: tuple[WordTiming, ...]
    name = "words"


@dataclass(frozen=True)
class Cancelled:
    """The utterance stopped on a barge-in; `heard_text` is what the listener had heard."""

    utterance_id: str
    played_ms: float | None = None
    heard_text: str | None = None
    name = "cancelled"


@dataclass(frozen=True)
class Flushed:
    """The reply's audio up to the client's flush `flush_id` has all been sent (the speak
    WebSocket's protocol 2)."""

    flush_id: FlushId
    name = "flushed"


@dataclass(frozen=True)
class AudioStreamEnd:
    total_chunks: int
    duration_s: float
    name = "audio_stream_end"


@dataclass(frozen=True)
class AgentEnd:
    metrics: dict[str, Any]
    stop_reason: str | None = None  # why the LLM's answer ended, where the source says
    name = "agent_end"


@dataclass(frozen=True)
class ErrorEvent:
    code: str
    message: str
    retryable: bool = False
    status: int = 500  # the HTTP status the gateway's HTTP routes give the code
    name = "error"


Event = (
    AgentStart
    | TextDelta
    | AudioStreamStart
    | AudioChunk
    | Words
    | AudioStreamEnd
    | AgentEnd
    | ErrorEvent
    | Cancelled
    | Flushed
)


def payload(event: Event) -> dict[str, Any]:
    """The JSON body of an event, without audio bytes (SSE adds base64, WS sends binary)."""
    if isinstance(event, Words):
        return {"words": [word_ms(w) for w in event.words]}
    body = asdict(event)
    body.pop("data", None)
    if isinstance(event, Cancelled):  # a plain cancel says nothing of what was heard
        body = {k: v for k, v in body.items() if v is not None}
    return body


def word_ms(word: WordTiming) -> dict[str, Any]:
    return {"word": word.word, "start_ms": round(word.start), "end_ms": round(word.end)}
