"""The `data` of Server-Sent Events, incrementally and pure: `push(bytes) -> [data]`,
`flush() -> [data]`.

Input may be cut anywhere: inside a UTF-8 character, between the CR and LF of a line ending,
inside a long `data:` line. Each chunk is scanned once and a line's pieces are joined once it is
complete, so a long event (seconds of base64 audio cut into many transport chunks) costs time in
proportion to its size. Lines end with CRLF, LF or CR; an event ends at a blank line; comments
and other fields are skipped."""

from __future__ import annotations

import codecs
import re

_LINE_END = re.compile(r"\r\n|\r|\n")


class SSEDataDecoder:
    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._partial: list[str] = []  # the current line's pieces, before its line end
        self._pending_cr = False  # the last chunk ended in CR: an LF opening the next pairs it
        self._data: list[str] = []

    def push(self, chunk: bytes) -> list[str]:
        text = self._utf8.decode(chunk)
        if not text:
            return []
        if self._pending_cr and text[0] == "\n":
            text = text[1:]  # the LF of a CRLF cut between chunks
        self._pending_cr = text.endswith("\r")
        out: list[str] = []
        start = 0
        for match in _LINE_END.finditer(text):
            self._partial.append(text[start : match.start()])
            line = "".join(self._partial)
            self._partial.clear()
            data = self._line(line)
            if data is not None:
                out.append(data)
            start = match.end()
        if start < len(text):
            self._partial.append(text[start:])
        return out

    def flush(self) -> list[str]:
        """The end of the stream: an event without its closing blank line is discarded (as the
        SSE specification says); the decoder starts over."""
        self._utf8.reset()
        self._partial, self._data, self._pending_cr = [], [], False
        return []

    def _line(self, line: str) -> str | None:
        if not line:
            if not self._data:
                return None
            data = "\n".join(self._data)
            self._data = []
            return data
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value.removeprefix(" "))
        return None
