"""The services' log lines: one record is one line. What a client sent (a path, an id) can
carry a newline or a terminal escape; every character that is not printable is written as an
escape (`\\x0a`, `\\x1b`), so a request cannot forge a second line or recolour a terminal."""

from __future__ import annotations

import logging
from typing import TextIO

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def printable(text: str) -> str:
    """`text` with each character that is not printable written as a Python escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


class OneLineFormatter(logging.Formatter):
    """The message escaped (a traceback, written after it by the operator's own code, keeps
    its lines)."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


def configure(level: str, stream: TextIO | None = None) -> None:
    """The root logger for a service's command: `level`, one escaped line per record (as
    `logging.basicConfig`, nothing changes where the root logger has handlers already)."""
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
