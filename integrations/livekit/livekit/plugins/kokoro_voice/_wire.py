"""The gateway's wire formats, pure (bytes and JSON in, values out; no I/O): the speak
WebSocket's messages and audio frames, its `words` events as LiveKit's timed strings, the
Server-Sent Events of `POST /v1/audio/speech`, and the gateway's errors as LiveKit's."""

from __future__ import annotations

import codecs
import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from livekit.agents import APIError, APIStatusError
from livekit.agents.types import TimedString

SAMPLE_RATE = 24_000
NUM_CHANNELS = 1

# The HTTP status the gateway's HTTP routes answer each error code with; the speak WebSocket
# sends the same codes in error frames, with no status of their own.
_STATUS = {
    "unauthorized": 401,
    "origin_not_allowed": 403,
    "token_not_for_route": 403,
    "host_not_allowed": 400,
    "rate_limited": 429,
    "too_many_sessions": 429,
    "overloaded": 503,
    "tts_unavailable": 503,
    "internal_error": 500,
    "llm_error": 502,
    "idle_timeout": 408,
}
_CLIENT_ERRORS = {
    "invalid_json",
    "not_an_object",
    "unknown_type",
    "invalid_field",
    "empty_text",
    "text_too_long",
    "busy",
    "no_open_utterance",
    "nothing_to_cancel",
    "binary_frame",
    "unknown_voice",
    "reply_too_long",
    "missing_text",
}


@dataclass(frozen=True)
class Endpoints:
    speak_ws: str
    speech: str


def endpoints(base_url: str) -> Endpoints:
    """The gateway's two routes from its base URL (`http://host:port`, with or without a
    trailing `/v1`, as OpenAI-style clients are often given it)."""
    parts = urlsplit(base_url.rstrip("/"))
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ValueError(f"the gateway URL must be http(s)://host[:port], not {base_url!r}")
    path = parts.path.removesuffix("/v1")
    secure = parts.scheme in ("https", "wss")
    http = urlunsplit(("https" if secure else "http", parts.netloc, path, "", ""))
    ws = urlunsplit(("wss" if secure else "ws", parts.netloc, path, "", ""))
    return Endpoints(speak_ws=f"{ws}/v1/speak/ws", speech=f"{http}/v1/audio/speech")


def speak_message(
    utterance_id: str, voice: str | None, speed: float, timestamps: bool = True
) -> str:
    """`speak` with no text: the client streams it (`text` deltas, then `flush`)."""
    body: dict[str, Any] = {
        "type": "speak",
        "utterance_id": utterance_id,
        "mode": "bidi",
        "format": "pcm",
        "speed": speed,
        "timestamps": timestamps,
    }
    if voice is not None:
        body["voice"] = voice
    return json.dumps(body)


def text_message(delta: str) -> str:
    return json.dumps({"type": "text", "delta": delta})


FLUSH = json.dumps({"type": "flush"})
CANCEL = json.dumps({"type": "cancel"})


def split_audio_frame(frame: bytes) -> tuple[str, bytes]:
    """A binary frame: byte 0 is n, bytes 1..n the utterance id, the rest 24 kHz s16 mono PCM."""
    if not frame:
        raise ValueError("an empty audio frame")
    n = frame[0]
    if len(frame) < 1 + n:
        raise ValueError(f"an audio frame shorter than its utterance id ({len(frame)} bytes)")
    return frame[1 : 1 + n].decode("ascii"), frame[1 + n :]


def timed_words(event: dict[str, Any]) -> list[TimedString]:
    """A `words` event as LiveKit's aligned transcript: one `TimedString` per word, in seconds
    from the utterance's first sample, each followed by the space that joins it to the next
    (LiveKit's transcript joins the strings as they come)."""
    return [
        TimedString(
            f"{word['word']} ",
            start_time=word["start_ms"] / 1000,
            end_time=word["end_ms"] / 1000,
        )
        for word in event.get("words", [])
    ]


def status_for(code: str) -> int:
    """The HTTP status of a gateway error code (what its HTTP routes answer with it)."""
    if code in _STATUS:
        return _STATUS[code]
    if code in _CLIENT_ERRORS:
        return 400
    if code.startswith("tts_"):  # the speech side failed: the gateway is its proxy
        return 502
    return 500


def error_from_frame(event: dict[str, Any], request_id: str | None = None) -> APIStatusError:
    """A WebSocket error frame `{"type": "error", "code", "message", "retryable"}`."""
    code = str(event.get("code", "internal_error"))
    message = str(event.get("message", "the gateway reported an error"))
    return APIStatusError(
        f"{code}: {message}",
        status_code=status_for(code),
        request_id=request_id,
        body=event,
        retryable=bool(event.get("retryable", False)),
    )


def error_from_http(status: int, body: bytes, request_id: str | None = None) -> APIStatusError:
    """An HTTP error answer, `{"error": {"code", "message", "retryable"}}` (any other body is
    kept as text; retryable then follows the status)."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not isinstance(error, dict):
        text = body.decode("utf-8", "replace")[:200]
        return APIStatusError(
            f"HTTP {status}: {text}",
            status_code=status,
            request_id=request_id,
            body=text,
            retryable=status >= 500 or status in (408, 429),
        )
    code = str(error.get("code", "error"))
    return APIStatusError(
        f"{code}: {error.get('message', '')}",
        status_code=status,
        request_id=request_id,
        body=error,
        retryable=bool(error.get("retryable", False)),
    )


def error_from_sse(event: dict[str, Any]) -> APIError:
    """`{"type": "error", "error": {"code", "message"}}` in a speech stream: after the headers,
    so no status; not retryable, since audio may already have been played."""
    error = event.get("error") or {}
    code = str(error.get("code", "error"))
    return APIError(f"{code}: {error.get('message', '')}", body=error, retryable=False)


class SSEDataDecoder:
    """The `data` of each Server-Sent Event, incrementally: `push(bytes) -> [data]`. Lines end
    with CRLF, LF or CR; an event ends at a blank line; chunk boundaries fall anywhere."""

    def __init__(self) -> None:
        self._buffer = ""
        self._data: list[str] = []
        self._utf8 = codecs.getincrementaldecoder("utf-8")()  # a character cut by a chunk

    def push(self, chunk: bytes) -> list[str]:
        self._buffer += self._utf8.decode(chunk)
        events: list[str] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return events
            line, length = cut
            self._buffer = self._buffer[length:]
            if line == "":
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)


def _line_end(buffer: str) -> tuple[str, int] | None:
    """The first complete line and how many characters it takes, ending included. A CR at the
    very end may be the first half of a CRLF: wait for more."""
    lf, cr = buffer.find("\n"), buffer.find("\r")
    if cr == -1 or (lf != -1 and lf < cr):
        return None if lf == -1 else (buffer[:lf], lf + 1)
    if cr + 1 == len(buffer):
        return None
    return buffer[:cr], cr + 2 if buffer[cr + 1] == "\n" else cr + 1
