"""The speak WebSocket's protocol 2, sans I/O: several contexts on one connection. Parsed client
messages, outcomes and the time in; the same actions as protocol 1's session (`session`) out.

- `speak` opens a context under its `context_id` (or one the server makes), with its own
  voice, speed, format, sample rate and buffering; past `max_contexts` open at once it is
  refused (`too_many_contexts`, retryable once one ends), and an id still open is refused
  (`context_in_use`). Contexts play at once, side by side: none waits for another.
- `text` and `flush` name their context, which must be taking the client's text
  (`unknown_context` for an id not open, `context_not_open` for one whose text is given, or
  whose text the client closed). `flush` makes what came so far final and keeps the context
  open (its `flush_id` is answered by the reply once that audio is sent); `close_context`
  says no more text is coming: the context ends once its audio has.
- `cancel` stops that context alone, answered `cancelled` once it has stopped.
- A context taking the client's text with no message naming it and nothing to say for
  `idle_s` is closed (`ExpireContext`; the client gets `context_closed`, reason `idle`); a
  context that is still synthesizing is not idle.
- Client text past `max_text_chars` per context is refused (`text_too_long`), what came before
  is kept; prompts keep one conversation for the connection (`session.Conversation`).

Time is the caller's clock in seconds (`now`); nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import BadRequest, GatewayError
from gateway.params import Buffering, SpeakParams
from gateway.sources.base import FlushMark
from gateway.speak_ws.protocol import (
    CONTEXT_KEY,
    Cancel,
    ClientMessage,
    Close,
    CloseContext,
    Flush,
    Invalid,
    Speak,
    Text,
    cancelled_frame,
    context_closed_frame,
)
from gateway.speak_ws.session import (
    Action,
    CancelUtterance,
    CloseConnection,
    Conversation,
    EndText,
    ExpireContext,
    FeedText,
    SendError,
    SendFrame,
    StartUtterance,
    Turn,
    new_utterance_id,
)
from kokoro_contract import limits
from kokoro_contract.errors import ServiceError

MAX_CONTEXTS = 5  # the default of --max-contexts-per-socket
CONTEXT_IDLE_S = 20.0  # the default of --context-idle-s


@dataclass
class _Context:
    prompt: str | None
    text_open: bool  # takes the client's text, and the client has not closed it
    client_text: bool  # its text is the client's (else given whole, or an LLM's)
    active_at: float  # its last message, or the last moment it was seen synthesizing
    text_chars: int = 0


class ContextSession:
    def __init__(
        self,
        new_id: Callable[[], str] = new_utterance_id,
        max_text_chars: int = limits.MAX_TEXT_CHARS,
        max_history_chars: int = 8_000,
        max_contexts: int = MAX_CONTEXTS,
        idle_s: float = CONTEXT_IDLE_S,
    ) -> None:
        self._new_id = new_id
        self.max_text_chars = max_text_chars
        self.max_contexts = max_contexts
        self.idle_s = idle_s
        self.conversation = Conversation(max_history_chars)
        self._contexts: dict[str, _Context] = {}
        self.closed = False

    @property
    def history(self) -> list[Turn]:
        return self.conversation.turns

    @property
    def open_ids(self) -> tuple[str, ...]:
        """The contexts open now, oldest first."""
        return tuple(self._contexts)

    @property
    def utterance_id(self) -> str | None:
        """The newest context open (what a connection-wide error names), if any."""
        return next(reversed(self._contexts), None)

    # --- client messages --------------------------------------------------------------------

    def receive(self, message: ClientMessage, now: float = 0.0) -> list[Action]:
        if self.closed:
            return []
        match message:
            case Invalid(error=error):
                return [SendError(error, key=CONTEXT_KEY)]
            case Speak(params=params, buffering=buffering):
                return self._speak(params, buffering, now)
            # the parser names a context in every protocol 2 message
            case Text(delta=delta, context_id=str() as cid):
                return self._taking_text(cid, now, lambda c: self._feed(cid, c, delta))
            case Flush(context_id=str() as cid, flush_id=flush_id):
                return self._taking_text(cid, now, lambda _: [FeedText(FlushMark(flush_id), cid)])
            case CloseContext(context_id=cid):
                return self._taking_text(cid, now, lambda c: self._close_text(cid, c))
            case Cancel(played_ms=played_ms, context_id=str() as cid):
                if cid not in self._contexts:
                    return [self._unknown(cid)]
                return [CancelUtterance(cid, played_ms)]
            case Close():
                self.closed = True
                return [CloseConnection()]
        raise AssertionError(f"unhandled message {message!r}")

    def _speak(self, params: SpeakParams, buffering: Buffering, now: float) -> list[Action]:
        cid = params.utterance_id or self._new_id()
        if cid in self._contexts:
            error = BadRequest(
                f"context {cid!r} is open: close or cancel it first, or use a new id",
                code="context_in_use",
            )
            return [SendError(error, cid, CONTEXT_KEY)]
        if len(self._contexts) >= self.max_contexts:
            full = GatewayError(
                f"{self.max_contexts} contexts are open on this connection, the limit: close or "
                "cancel one first",
                code="too_many_contexts",
                status=429,
                retryable=True,
            )
            return [SendError(full, cid, CONTEXT_KEY)]
        client_text = params.text is None and params.prompt is None
        self._contexts[cid] = _Context(params.prompt, client_text, client_text, now)
        history = tuple(self.conversation.turns)
        return [StartUtterance(cid, params, history, client_text, buffering)]

    def _taking_text(
        self, cid: str, now: float, then: Callable[[_Context], list[Action]]
    ) -> list[Action]:
        context = self._contexts.get(cid)
        if context is None:
            return [self._unknown(cid)]
        if not context.text_open:
            error = BadRequest(
                f"context {cid!r} takes no more text: its text was given, or closed",
                code="context_not_open",
            )
            return [SendError(error, cid, CONTEXT_KEY)]
        context.active_at = now
        return then(context)

    def _feed(self, cid: str, context: _Context, delta: str) -> list[Action]:
        if context.text_chars + len(delta) > self.max_text_chars:
            error = BadRequest(
                f"a context's text is limited to {self.max_text_chars} characters; this delta "
                "was dropped (close or cancel the context)",
                code="text_too_long",
            )
            return [SendError(error, cid, CONTEXT_KEY)]
        context.text_chars += len(delta)
        return [FeedText(delta, cid)]

    def _close_text(self, cid: str, context: _Context) -> list[Action]:
        context.text_open = False
        return [EndText(cid)]

    def _unknown(self, cid: str) -> SendError:
        error = BadRequest(f"no context {cid!r} is open", code="unknown_context")
        return SendError(error, cid, CONTEXT_KEY)

    # --- the clock ----------------------------------------------------------------------------

    def expires_at(self) -> float:
        """When the first context taking the client's text may be idle (inf: none)."""
        times = [c.active_at + self.idle_s for c in self._contexts.values() if c.text_open]
        return min(times, default=math.inf)

    def expire(self, now: float, waiting: Callable[[str], bool]) -> list[Action]:
        """The contexts idle at `now`: taking the client's text, no message for `idle_s`, and
        `waiting` for text (nothing to synthesize or send); one still at work is active now."""
        out: list[Action] = []
        for cid, context in self._contexts.items():
            if context.text_open and now >= context.active_at + self.idle_s:
                if waiting(cid):
                    out.append(ExpireContext(cid))
                else:
                    context.active_at = now
        return out

    # --- outcomes -------------------------------------------------------------------------------

    def start_failed(self, context_id: str, error: ServiceError) -> list[Action]:
        """The context could not start (its request was refused): nothing was sent for it."""
        self._contexts.pop(context_id, None)
        return [SendError(error, context_id, CONTEXT_KEY)]

    def utterance_ended(self, context_id: str, spoken: str, failed: bool = False) -> list[Action]:
        """The context's reply ended (`agent_end` sent) after speaking `spoken`."""
        context = self._contexts.pop(context_id, None)
        if context is not None:
            self.conversation.ended(context.prompt, spoken, failed)
        return []

    def utterance_cancelled(
        self, context_id: str, played_ms: float | None = None, heard: str | None = None
    ) -> list[Action]:
        """A cancel stopped the context; `heard`: what the listener heard of it."""
        context = self._contexts.pop(context_id, None)
        if context is not None:
            self.conversation.interrupted(context.prompt, heard)
        return [SendFrame(cancelled_frame(context_id, played_ms, heard, CONTEXT_KEY))]

    def context_expired(self, context_id: str) -> list[Action]:
        """An idle context has stopped: the client is told it is closed."""
        if self._contexts.pop(context_id, None) is None:
            return []  # it ended meanwhile
        return [SendFrame(context_closed_frame(context_id, "idle"))]
