"""The speak WebSocket's error frames, pure: what one says, and the rule every client follows
for whether it ends the utterance (docs/protocols.md, "WebSocket /v1/speak/ws").

An error frame is `{"type": "error", "code", "message", "retryable", "status",
"retry_after_s"?, "utterance_id"?}`; `status` is the HTTP status the gateway's HTTP routes
answer the code with, so a client needs no table of codes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# errors without an utterance id that answer a `speak` which did not parse
SPEAK_REFUSALS = frozenset({"invalid_field", "invalid_json", "not_an_object"})
# the gateway closes the connection after it (idle; its token expired; its age limit)
CLOSING = frozenset({"idle_timeout", "token_expired", "max_connection_age"})
# an utterance that keeps going after it (the delta was dropped, the rest is spoken)
KEEPS_GOING = frozenset({"text_too_long", "text_queue_full"})


@dataclass(frozen=True)
class GatewayError:
    code: str
    message: str
    retryable: bool
    status: int
    utterance_id: str | None = None
    retry_after_s: float | None = None

    @classmethod
    def from_frame(cls, body: dict[str, Any]) -> GatewayError:
        uid = body.get("utterance_id", body.get("context_id"))  # protocol 2 names a context
        after = body.get("retry_after_s")
        status = body.get("status")
        return cls(
            code=str(body.get("code", "internal_error")),
            message=str(body.get("message", "the gateway reported an error")),
            retryable=bool(body.get("retryable", False)),
            # (a gateway from before `status`: the speech side's failures are a proxy's 502)
            status=status if isinstance(status, int) else _status_without_one(body),
            utterance_id=uid if isinstance(uid, str) else None,
            retry_after_s=float(after) if isinstance(after, int | float) else None,
        )

    def __str__(self) -> str:
        retry = ""
        if self.retryable:
            after = f" after {self.retry_after_s:g} s" if self.retry_after_s else ""
            retry = f" (retryable{after})"
        return f"{self.code}: {self.message}{retry}"


def _status_without_one(body: dict[str, Any]) -> int:
    return 502 if str(body.get("code", "")).startswith("tts_") else 500


def ends_utterance(body: dict[str, Any], utterance_id: str, answered: bool) -> bool:
    """Whether an error frame ends the utterance `utterance_id`. `answered`: the gateway has
    already sent an event or audio of its reply.

    Only two kinds do: an error that closes the connection (`idle_timeout`, `token_expired`,
    `max_connection_age`), and one that refuses the `speak` before its reply started (with the
    utterance's id, or with none when the `speak` did not parse). An error during a reply
    (`tts_*`, `llm_error`, `reply_too_long`) is followed by its `agent_end`, `text_too_long`
    and `text_queue_full` keep the utterance going, and the rest (`busy`, `nothing_to_cancel`,
    `no_open_utterance`, ...) answer some other message: the client reads on."""
    code = body.get("code")
    if code in CLOSING:
        return True
    if answered or code in KEEPS_GOING:
        return False
    uid = body.get("utterance_id")
    if uid is not None:
        return bool(uid == utterance_id)
    return code in SPEAK_REFUSALS


def ends_context(body: dict[str, Any], context_id: str, answered: bool) -> bool:
    """Protocol 2 (`?protocol=2`): whether an error frame ends context `context_id`.
    `answered`: the gateway has already sent an event or audio of the context's reply.

    Every error frame there names the context it concerns (`context_id`), so: an error that
    closes the connection ends them all; `unknown_context` naming it says the gateway holds no
    such context (its `speak` was refused by an error that could not name it, as one that
    did not parse, or it ended while the message was on its way); any other error naming it
    before its reply started refuses its `speak` (`unknown_voice`, `too_many_contexts`,
    `overloaded`, ...), except `text_too_long` and `text_queue_full`, which keep it going. An
    error during its reply is followed by its `agent_end`."""
    code = body.get("code")
    if code in CLOSING:
        return True
    if body.get("context_id") != context_id:
        return False
    if code == "unknown_context":
        return True
    return not answered and code not in KEEPS_GOING


def is_stale(body: dict[str, Any]) -> bool:
    """A connection reused from a pool whose first frame after a `speak` is this error is not
    fit for the utterance: the gateway closed it (`idle_timeout`, `max_connection_age`,
    `token_expired`, read only now), or it still
    answers something from before (an error with no utterance id that does not refuse the
    `speak`, such as `busy`). Open a fresh one and try again."""
    if body.get("code") in CLOSING:
        return True
    return body.get("utterance_id") is None and body.get("code") not in SPEAK_REFUSALS
