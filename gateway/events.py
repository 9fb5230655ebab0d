"""The events of one reply, the same for every transport (SSE, WebSocket) and mode."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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
class AudioStreamEnd:
    total_chunks: int
    duration_s: float
    name = "audio_stream_end"


@dataclass(frozen=True)
class AgentEnd:
    metrics: dict[str, Any]
    name = "agent_end"


@dataclass(frozen=True)
class ErrorEvent:
    code: str
    message: str
    retryable: bool = False
    name = "error"


Event = (
    AgentStart | TextDelta | AudioStreamStart | AudioChunk | AudioStreamEnd | AgentEnd | ErrorEvent
)


def payload(event: Event) -> dict[str, Any]:
    """The JSON body of an event, without audio bytes (SSE adds base64, WS sends binary)."""
    body = asdict(event)
    body.pop("data", None)
    return body
