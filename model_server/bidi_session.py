"""The bidirectional session's rules, sans I/O: parsed client messages and synthesis outcomes
in, actions out (frames to send, a synthesis to start or abort, the session to close).

One request runs at a time per session, in arrival order; the others wait in the session's
queue, at most `max_pending` in all. A request id may not be reused while it is pending. A
cancel drops queued requests at once (each answered `synthesis_cancelled`) and aborts the
running one (answered when the abort has taken effect). The route (`routes/ws.py`) carries the
actions out and reports back when a synthesis has finished, failed or been cancelled.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kokoro_contract.protocol import Cancel as CancelMessage
from kokoro_contract.protocol import (
    CancelledMsg,
    ClientMessage,
    CompleteMsg,
    ErrorMsg,
    ProtocolError,
    StartMsg,
    SynthesisRequest,
)
from kokoro_contract.protocol import Close as CloseMessage


@dataclass(frozen=True)
class Send:
    """A control frame for the client."""

    frame: str


@dataclass(frozen=True)
class StartSynthesis:
    request: SynthesisRequest


@dataclass(frozen=True)
class AbortSynthesis:
    request_id: str


@dataclass(frozen=True)
class CloseSession:
    pass


Action = Send | StartSynthesis | AbortSynthesis | CloseSession


class BidiSession:
    def __init__(self, max_pending: int) -> None:
        self.max_pending = max_pending
        self._queue: deque[SynthesisRequest] = deque()
        self._running: SynthesisRequest | None = None
        self._aborting = False
        self.closed = False

    @property
    def pending_ids(self) -> list[str]:
        """The running request first, then the queued ones in order."""
        running = [self._running.request_id] if self._running is not None else []
        return running + [r.request_id for r in self._queue]

    # --- client messages --------------------------------------------------------------------

    def receive(self, message: ClientMessage) -> list[Action]:
        if self.closed:
            return []
        match message:
            case ProtocolError():
                return [Send(message.encode())]
            case SynthesisRequest():
                return self._submit(message)
            case CancelMessage(request_id=rid):
                return self._cancel(rid)
            case CloseMessage():
                self.closed = True
                return [CloseSession()]
        raise AssertionError(f"unhandled message {message!r}")

    def _submit(self, request: SynthesisRequest) -> list[Action]:
        rid = request.request_id
        pending = self.pending_ids
        if rid in pending:
            return [
                _error("duplicate_request_id", f"request {rid!r} is already queued or running", rid)
            ]
        if len(pending) >= self.max_pending:
            return [
                _error(
                    "too_many_pending",
                    f"{len(pending)} requests are already pending on this session; "
                    "wait for one to complete",
                    rid,
                )
            ]
        self._queue.append(request)
        return self._next()

    def _cancel(self, request_id: str | None) -> list[Action]:
        actions: list[Action] = []
        for request in [r for r in self._queue if request_id in (None, r.request_id)]:
            self._queue.remove(request)
            actions.append(Send(CancelledMsg(request.request_id).encode()))
        running = self._running
        if running is not None and request_id in (None, running.request_id):
            if not self._aborting:
                self._aborting = True
                actions.append(AbortSynthesis(running.request_id))
        elif request_id is not None and not actions:
            actions.append(
                _error(
                    "unknown_request_id", f"no queued or running request {request_id!r}", request_id
                )
            )
        return actions

    # --- synthesis outcomes -----------------------------------------------------------------

    def synthesis_finished(
        self, request_id: str, audio_bytes: int, elapsed_s: float
    ) -> list[Action]:
        self._settle(request_id)
        return [Send(CompleteMsg(request_id, audio_bytes, elapsed_s).encode()), *self._next()]

    def synthesis_failed(self, request_id: str, code: str, message: str) -> list[Action]:
        self._settle(request_id)
        return [_error(code, message, request_id), *self._next()]

    def synthesis_cancelled(self, request_id: str) -> list[Action]:
        self._settle(request_id)
        return [Send(CancelledMsg(request_id).encode()), *self._next()]

    def _settle(self, request_id: str) -> None:
        if self._running is None or self._running.request_id != request_id:
            raise RuntimeError(f"request {request_id!r} is not the one running")
        self._running = None
        self._aborting = False

    def _next(self) -> list[Action]:
        if self._running is not None or not self._queue or self.closed:
            return []
        self._running = request = self._queue.popleft()
        return [Send(StartMsg(request.request_id).encode()), StartSynthesis(request)]


def _error(code: str, message: str, request_id: str | None) -> Send:
    return Send(ErrorMsg(code, message, request_id).encode())
