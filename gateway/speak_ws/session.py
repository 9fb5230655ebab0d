"""The speak WebSocket's rules, sans I/O: parsed client messages and utterance outcomes in,
actions out (frames to send, an utterance to start, text to feed, an utterance to cancel).
This is protocol 1's session; protocol 2's (several contexts) is `contexts.ContextSession`,
which gives the same actions.

One utterance at a time per connection: `speak` while one is still playing is refused
(`busy`: cancel it first). An utterance without `text` or `prompt` takes the client's own text
(`text` deltas, then `flush`); text with no such utterance open is refused
(`no_open_utterance`). `cancel` stops the running utterance and is answered with `cancelled`
once it has stopped. Conversation history (for LLM prompts) keeps each prompt with the text of
its reply once the reply has ended, or of an interrupted reply what the listener heard (marked
as interrupted); a failed or empty reply, or one cancelled before anything was heard, is not
kept, and the
oldest turns go once the history passes `max_history_chars`. Client text past `max_text_chars`
per utterance is refused (`text_too_long`); the utterance keeps what came before.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

from gateway.errors import BadRequest
from gateway.params import Buffering, SpeakParams
from gateway.sources.base import FlushMark
from gateway.speak_ws.protocol import (
    UTTERANCE_KEY,
    Cancel,
    ClientMessage,
    Close,
    CloseContext,
    Flush,
    Invalid,
    Speak,
    Text,
    cancelled_frame,
    error_frame,
)
from kokoro_contract import limits
from kokoro_contract.errors import ServiceError

Turn = dict[str, str]  # {"role", "content"}, as LLM chat APIs take them
INTERRUPTED = "[interrupted: the user heard only this much]"


@dataclass(frozen=True)
class SendFrame:
    frame: str


@dataclass(frozen=True)
class SendError:
    error: ServiceError
    utterance_id: str | None = None
    key: str = UTTERANCE_KEY  # what names the id in the frame (`protocol.CONTEXT_KEY`)

    @property
    def frame(self) -> str:
        return error_frame(self.error, self.utterance_id, self.key)


@dataclass(frozen=True)
class StartUtterance:
    utterance_id: str
    params: SpeakParams
    history: tuple[Turn, ...]
    client_text: bool  # the client streams the text itself
    buffering: Buffering = Buffering.GATEWAY


@dataclass(frozen=True)
class FeedText:
    delta: str | FlushMark  # text, or where the client flushed (protocol 2)
    utterance_id: str


@dataclass(frozen=True)
class EndText:
    utterance_id: str


@dataclass(frozen=True)
class CancelUtterance:
    utterance_id: str
    played_ms: float | None = None


@dataclass(frozen=True)
class ExpireContext:
    """Protocol 2: stop a context idle past its limit, then tell the client it is closed."""

    context_id: str


@dataclass(frozen=True)
class CloseConnection:
    pass


Action = (
    SendFrame
    | SendError
    | StartUtterance
    | FeedText
    | EndText
    | CancelUtterance
    | ExpireContext
    | CloseConnection
)


def new_utterance_id() -> str:
    return uuid.uuid4().hex[:16]


def trim_history(history: list[Turn], max_chars: int) -> None:
    """Drop the oldest exchanges (prompt and answer together) until `history` holds at most
    `max_chars` characters (the WebSocket's conversations and AgentCore's keep this rule)."""
    while history and sum(len(t["content"]) for t in history) > max_chars:
        del history[:2]


class Conversation:
    """A connection's history for LLM prompts (both protocols): each prompt with the text of
    its reply once the reply has ended, or of an interrupted reply what the listener heard
    (marked as interrupted); a failed or empty reply, or one cancelled before anything was
    heard, is not kept, and the oldest turns go past `max_chars`."""

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max_chars
        self.turns: list[Turn] = []

    def ended(self, prompt: str | None, spoken: str, failed: bool) -> None:
        """A failed or empty reply is not a turn: an empty assistant turn would make Bedrock
        refuse every later prompt."""
        if prompt is not None and spoken.strip() and not failed:
            self._add(prompt, spoken)

    def interrupted(self, prompt: str | None, heard: str | None) -> None:
        if prompt is not None and heard and heard.strip():
            self._add(prompt, f"{heard.strip()} {INTERRUPTED}")

    def _add(self, prompt: str, answer: str) -> None:
        self.turns += [
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": answer},
        ]
        trim_history(self.turns, self.max_chars)


@dataclass
class _Utterance:
    utterance_id: str
    prompt: str | None
    text_open: bool
    text_chars: int = 0


class SpeakSession:
    def __init__(
        self,
        new_id: Callable[[], str] = new_utterance_id,
        max_text_chars: int = limits.MAX_TEXT_CHARS,
        max_history_chars: int = 8_000,
    ) -> None:
        self._new_id = new_id
        self.max_text_chars = max_text_chars
        self._current: _Utterance | None = None
        self.conversation = Conversation(max_history_chars)
        self.closed = False

    @property
    def history(self) -> list[Turn]:
        return self.conversation.turns

    @property
    def utterance_id(self) -> str | None:
        """The utterance playing now, if any."""
        return self._current.utterance_id if self._current is not None else None

    # --- client messages --------------------------------------------------------------------

    def receive(self, message: ClientMessage, now: float = 0.0) -> list[Action]:
        """What to do for a client message (`now`: protocol 2's clock; unused here)."""
        if self.closed:
            return []
        match message:
            case Invalid(error=error):
                return [SendError(error)]
            case Speak(params=params):
                return self._speak(params)
            case Text(delta=delta):
                return self._open_text(lambda: self._feed(delta))
            case Flush():
                return self._open_text(self._flush)
            case Cancel(played_ms=played_ms):
                if self._current is None:
                    return [SendError(BadRequest("nothing to cancel", code="nothing_to_cancel"))]
                return [CancelUtterance(self._current.utterance_id, played_ms)]
            case Close():
                self.closed = True
                return [CloseConnection()]
            case CloseContext():  # protocol 2's; never parsed in protocol 1
                pass
        raise AssertionError(f"unhandled message {message!r}")

    def _speak(self, params: SpeakParams) -> list[Action]:
        if self._current is not None:
            error = BadRequest(
                "an utterance is still playing: cancel it first (barge-in)", code="busy"
            )
            return [SendError(error)]
        uid = params.utterance_id or self._new_id()
        client_text = params.text is None and params.prompt is None
        self._current = _Utterance(uid, params.prompt, text_open=client_text)
        return [StartUtterance(uid, params, tuple(self.history), client_text)]

    def _open_text(self, then: Callable[[], list[Action]]) -> list[Action]:
        if self._current is None or not self._current.text_open:
            error = BadRequest(
                "no utterance is waiting for text: send speak without text or prompt first",
                code="no_open_utterance",
            )
            return [SendError(error)]
        return then()

    def _feed(self, delta: str) -> list[Action]:
        current = self._current
        assert current is not None
        if current.text_chars + len(delta) > self.max_text_chars:
            error = BadRequest(
                f"an utterance's text is limited to {self.max_text_chars} characters; this "
                f"delta was dropped (flush or cancel)",
                code="text_too_long",
            )
            return [SendError(error, current.utterance_id)]
        current.text_chars += len(delta)
        return [FeedText(delta, current.utterance_id)]

    def _flush(self) -> list[Action]:
        assert self._current is not None
        self._current.text_open = False
        return [EndText(self._current.utterance_id)]

    # --- utterance outcomes -----------------------------------------------------------------

    def start_failed(self, utterance_id: str, error: ServiceError) -> list[Action]:
        """The utterance could not start (its request was refused): nothing was sent for it."""
        self._end(utterance_id)
        return [SendError(error, utterance_id)]

    def utterance_ended(self, utterance_id: str, spoken: str, failed: bool = False) -> list[Action]:
        """The reply ended (`agent_end` sent) after speaking `spoken`. A failed or empty reply
        is not a turn: an empty assistant turn would make Bedrock refuse every later prompt."""
        current = self._end(utterance_id)
        if current is not None:
            self.conversation.ended(current.prompt, spoken, failed)
        return []

    def utterance_cancelled(
        self, utterance_id: str, played_ms: float | None = None, heard: str | None = None
    ) -> list[Action]:
        """A barge-in stopped the utterance; `heard`: what the listener heard of it (from the
        word timings and `played_ms`). History keeps only that, marked as interrupted, so the
        next prompt is answered knowing what the user heard; nothing heard, nothing kept."""
        current = self._end(utterance_id)
        if current is not None:
            self.conversation.interrupted(current.prompt, heard)
        return [SendFrame(cancelled_frame(utterance_id, played_ms, heard))]

    def _end(self, utterance_id: str) -> _Utterance | None:
        current = self._current
        if current is None or current.utterance_id != utterance_id:
            return None  # already ended (a cancel that raced the reply's own end)
        self._current = None
        return current
