"""The services' log lines: one record is one line. What a client sent (a path, an id) can
carry a newline or a terminal escape; every character that is not printable is written as an
escape (`\\x0a`, `\\x1b`), so a request cannot forge a second line or recolour a terminal.
uvicorn's own lines lose their query strings, where tokens travel (`hide_query_strings`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable

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


class ProbeFilter(logging.Filter):
    """Access-log records of health probes only when a probe's answer changes: `/ping` is asked
    every few seconds (503 a dozen times while the model loads, then 200 for days), and what
    an operator needs is when it turned. Other requests pass. Reads uvicorn's access records
    (args: client, method, path, HTTP version, status); `worth_logging` serves a request log
    of one's own."""

    def __init__(self, paths: Iterable[str]) -> None:
        super().__init__()
        self.paths = frozenset(paths)
        self._last: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) == 5 and isinstance(args[2], str):
            path, status = args[2], args[4]  # uvicorn's access record
            return not isinstance(status, int) or self.worth_logging(path, status)
        return True

    def worth_logging(self, path: str, status: int) -> bool:
        """False for a probe that answers as it did last time."""
        path = path.split("?", 1)[0]
        if path not in self.paths:
            return True
        changed = self._last.get(path) != status
        self._last[path] = status
        return changed


# uvicorn's WebSocket line for an upgrade refused with a status (its websockets, websockets-sansio
# and wsproto protocols alike): whoever refused it logs it, with its reason
_UVICORN_REFUSAL = '%s - "WebSocket %s" %d'


def without_query(value: object) -> object:
    """A request target (`/path?query`) without its query string; anything else as it is."""
    if isinstance(value, str) and value.startswith("/") and "?" in value:
        return value.split("?", 1)[0]
    return value


class QueryFilter(logging.Filter):
    """uvicorn's own lines (`uvicorn.error`'s WebSocket lines, `uvicorn.access`) without query
    strings, where tokens travel (`?token=`), and without its line for a refused WebSocket
    upgrade (the refusal is logged, once, with its reason, by the middleware that refused)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == _UVICORN_REFUSAL:
            return False
        if isinstance(record.args, tuple):
            record.args = tuple(without_query(arg) for arg in record.args)
        return True


UVICORN_LOGGERS = ("uvicorn.error", "uvicorn.access")


def hide_query_strings() -> None:
    """`QueryFilter` on uvicorn's loggers (once; uvicorn's own logging set-up keeps it)."""
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, QueryFilter) for f in logger.filters):
            logger.addFilter(QueryFilter())


def configure(level: str) -> None:
    """The root logger for a service's command: `level`, one escaped line per record (as
    `logging.basicConfig`, nothing changes where the root logger has handlers already)."""
    handler = logging.StreamHandler()  # stderr
    handler.setFormatter(OneLineFormatter(FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler])
