"""How both services' listeners hold connections, the part uvicorn leaves open: a client that
sends its request head or body slowly (or nothing at all) is closed, a refused WebSocket
upgrade is not an error, and no `Server` header names the software. `uvicorn_options` is what
`gateway.cli`, `model_server.cli` and the tests' servers give `uvicorn.Config`.

uvicorn has a keep-alive timeout (idle between requests) but none for the head or the body,
and the ASGI app runs only once the head is complete, so these live in the HTTP protocol
(`TimedHttpProtocol`, uvicorn's httptools protocol with two deadlines):

- the head (request line and headers) must be complete within `header_s` of the connection
  opening, or of a kept-alive connection's next request starting: else `408` and closed;
- the body within `body_s` of the head: else `408 body_timeout` (if nothing was answered yet)
  and closed; the app reading it sees the client gone;
- between requests uvicorn's own `timeout_keep_alive` (`keepalive_s`).

A WebSocket upgrade refused with a status (the ASGI denial-response extension,
`kokoro_contract.asgi_deny`) is complete once its body is sent; uvicorn's websockets-sansio
protocol (0.54) then still logged `ERROR: ASGI callable returned without completing
handshake`, so anyone could write ERROR lines at will (`WebSocketProtocol`). The refusal is
logged once, at INFO, with its reason, by whoever refused it (uvicorn's and the `websockets`
library's own lines for it are left out); `logs.hide_query_strings` keeps tokens in query
strings out of uvicorn's lines.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
from uvicorn._types import ASGISendEvent
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from kokoro_contract import logs
from kokoro_contract.errors import error_body

log = logging.getLogger(__name__)

HEADER_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 30.0
KEEPALIVE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class ConnectionTimeouts:
    header_s: float = HEADER_TIMEOUT_S  # the request head, from the opening or a next request
    body_s: float = BODY_TIMEOUT_S  # the whole body, from the end of the head
    keepalive_s: float = KEEPALIVE_TIMEOUT_S  # idle between two requests

    def __post_init__(self) -> None:
        for name in ("header_s", "body_s", "keepalive_s"):
            if not getattr(self, name) > 0:
                raise ValueError(
                    f"connection timeouts are positive ({name}: {getattr(self, name)})"
                )


def timeout_response(code: str, message: str) -> bytes:
    """A whole `408` answer that closes the connection."""
    body = orjson.dumps(error_body(code, message))
    head = (
        b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
    )
    return head + body


class TimedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for the request head and one for the body
    (`timeouts`, set on a subclass by `http_protocol`)."""

    timeouts: ClassVar[ConnectionTimeouts] = ConnectionTimeouts()

    _deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.timeouts.header_s, self._head_late)  # a connection that sends nothing

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a kept-alive connection's next request
            self._arm(self.timeouts.header_s, self._head_late)

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()
        self._arm(self.timeouts.body_s, self._body_late)  # ended by on_message_complete

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def handle_websocket_upgrade(self) -> None:
        self._disarm()  # the WebSocket protocol has the connection from here
        super().handle_websocket_upgrade()

    def _arm(self, delay_s: float, late: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(delay_s, late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _head_late(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        log.debug("closed a connection whose request head took over %.1f s", self.timeouts.header_s)
        cycle: RequestResponseCycle | None = self.cycle
        if cycle is None or cycle.response_complete:  # not in the middle of an answer
            message = f"the request head took over {self.timeouts.header_s:g} s"
            self.transport.write(timeout_response("header_timeout", message))
        self.transport.close()

    def _body_late(self) -> None:
        self._deadline = None
        cycle: RequestResponseCycle | None = self.cycle
        if self.transport.is_closing():
            return
        log.debug("closed a connection whose request body took over %.1f s", self.timeouts.body_s)
        if cycle is not None and not cycle.response_complete:
            answered = cycle.response_started
            cycle.disconnected = (
                True  # the app's receive() says http.disconnect, its send is dropped
            )
            cycle.message_event.set()
            if not answered:
                message = f"the request body took over {self.timeouts.body_s:g} s"
                self.transport.write(timeout_response("body_timeout", message))
        self.transport.close()


_SILENT = logging.getLogger(f"{__name__}.silent")
_SILENT.disabled = True


class WebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol, for which an upgrade refused with an HTTP status
    (the denial-response extension) is a completed handshake, not an ERROR line, and whose
    `websockets` library does not log it again (`connection rejected (401 Unauthorized)`)."""

    async def send(self, message: ASGISendEvent) -> None:
        refusal_sent = message["type"] == "websocket.http.response.body" and not message.get(
            "more_body", False
        )
        if refusal_sent:
            self.conn.logger = _SILENT  # the refusal is logged by whoever refused, with why
        await super().send(message)
        if refusal_sent:
            self.handshake_complete = True  # answered: the ASGI app may return


def http_protocol(timeouts: ConnectionTimeouts) -> type[TimedHttpProtocol]:
    """`TimedHttpProtocol` with `timeouts` (uvicorn builds one protocol per connection)."""
    return type("TimedHttpProtocol", (TimedHttpProtocol,), {"timeouts": timeouts})


def uvicorn_options(timeouts: ConnectionTimeouts) -> dict[str, Any]:
    """`uvicorn.Config`'s options for a service's listener (installs `logs.hide_query_strings`
    on uvicorn's loggers)."""
    logs.hide_query_strings()
    return {
        "http": http_protocol(timeouts),
        "ws": WebSocketProtocol,
        "timeout_keep_alive": timeouts.keepalive_s,  # uvicorn's, used as a float delay
        "server_header": False,  # no `Server: uvicorn`
    }
