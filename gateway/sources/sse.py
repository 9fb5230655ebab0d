"""Server-Sent Events, pure: an incremental decoder (for OpenAI-compatible LLM streams and the
tests). Events the gateway sends are encoded by sse-starlette's `ServerSentEvent`.

Event boundaries (a blank line) do not line up with transport chunks: a decoder must buffer
until the boundary. `SSEDecoder.push(bytes) -> list[SSEEvent]` accepts input cut anywhere,
even inside a UTF-8 character or between the CR and LF of a line ending. Lines are found with
one regular expression over each chunk and joined from their pieces once complete, so a long
event (seconds of base64 audio in one `data:` line, cut into many transport chunks) costs time
in proportion to its size.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

_LINE_END = re.compile(r"\r\n|\r|\n")


@dataclass(frozen=True)
class SSEEvent:
    event: str = "message"
    data: str = ""
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial: list[str] = []  # the current line's pieces, before its line end
        self._pending_cr = False  # the last chunk ended in CR: an LF opening the next is its pair
        self._event = ""
        self._data: list[str] = []
        self._id: str | None = None
        self._retry: int | None = None
        self.last_event_id: str | None = None

    def push(self, chunk: bytes) -> list[SSEEvent]:
        text = self._text.decode(chunk)
        if not text:
            return []
        if self._pending_cr and text[0] == "\n":
            text = text[1:]  # the LF of a CRLF cut between chunks
        self._pending_cr = text.endswith("\r")
        out: list[SSEEvent] = []
        start = 0
        for match in _LINE_END.finditer(text):
            self._partial.append(text[start : match.start()])
            line = "".join(self._partial)
            self._partial.clear()
            event = self._line_done(line)
            if event is not None:
                out.append(event)
            start = match.end()
        if start < len(text):
            self._partial.append(text[start:])
        return out

    def flush(self) -> list[SSEEvent]:
        """End of stream: an event without its closing blank line is discarded (per spec)."""
        self._partial, self._data, self._event = [], [], ""
        return []

    def _line_done(self, line: str) -> SSEEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None  # comment / keep-alive
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\0" not in value:
            self._id = value
        elif name == "retry" and value.isdigit():
            self._retry = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        if self._id is not None:
            self.last_event_id = self._id
        if not self._data:
            self._event, self._id, self._retry = "", None, None
            return None
        event = SSEEvent(self._event or "message", "\n".join(self._data), self._id, self._retry)
        self._event, self._data, self._id, self._retry = "", [], None, None
        return event
