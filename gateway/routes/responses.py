"""Streamed responses that drop a client which stops reading: each send must be taken within
`--send-timeout-s`, or the response ends (its generator closes, which cancels the reply and
its upstreams), so a stalled client costs a bounded buffer, never a whole reply in memory.

Each holds the reply's place (`closing`: the `Gate.start` it was admitted in) and gives it back
when the response ends, however it ends: streamed to the end, the client gone, or the client
gone before the body was even started (its generator then never runs)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from sse_starlette import EventSourceResponse
from sse_starlette.sse import SendTimeoutError
from starlette.types import Message, Receive, Scope, Send

from kokoro_contract.cut_stream import CutStreamingResponse

log = logging.getLogger(__name__)


def _stalled(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return all(_stalled(e) for e in exc.exceptions)
    return isinstance(exc, SendTimeoutError)


@contextlib.contextmanager
def _dropping_stalled(what: str, timeout: float | None) -> Iterator[None]:
    """A send that timed out ends the response quietly: one log line, no traceback."""
    try:
        yield
    except BaseException as exc:
        if not _stalled(exc):
            raise
        log.info("dropped a client that took no %s for %s s", what, timeout)


class ReplyEventSource(EventSourceResponse):
    """`EventSourceResponse` that ends quietly (one log line) when its send times out."""

    def __init__(
        self, *args: Any, closing: contextlib.AsyncExitStack | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.closing = closing or contextlib.AsyncExitStack()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with self.closing:
            with _dropping_stalled("event", self.send_timeout):
                await super().__call__(scope, receive, send)


class TimedStreamingResponse(CutStreamingResponse):
    """A streamed body each of whose sends must be taken in time; one that cannot be finished
    (its iterator raises `StreamCut`) is cut."""

    def __init__(
        self,
        *args: Any,
        send_timeout: float,
        closing: contextlib.AsyncExitStack | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.send_timeout = send_timeout
        self.closing = closing or contextlib.AsyncExitStack()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def timed(message: Message) -> None:
            try:
                async with asyncio.timeout(self.send_timeout):
                    await send(message)
            except TimeoutError as exc:
                raise SendTimeoutError() from exc

        async with self.closing:
            with _dropping_stalled("audio", self.send_timeout):
                await super().__call__(scope, receive, timed)
