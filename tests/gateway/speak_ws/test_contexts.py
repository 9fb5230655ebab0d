"""Protocol 2's rules (`ContextSession`) and wire format, pure: literal messages in, actions out."""

from __future__ import annotations

import itertools

import orjson
import pytest

from gateway.params import Buffering
from gateway.sources.base import FlushMark
from gateway.speak_ws.contexts import ContextSession
from gateway.speak_ws.protocol import (
    CONTEXT_KEY,
    Cancel,
    ClientMessage,
    CloseContext,
    Flush,
    Invalid,
    Speak,
    Text,
    parse_client_message,
)
from gateway.speak_ws.session import (
    Action,
    CancelUtterance,
    CloseConnection,
    EndText,
    ExpireContext,
    FeedText,
    SendError,
    SendFrame,
    StartUtterance,
)


def msg(body: dict[str, object]) -> ClientMessage:
    return parse_client_message(orjson.dumps(body).decode(), version=2)


def session(**kwargs: object) -> ContextSession:
    ids = itertools.count(1)
    return ContextSession(new_id=lambda: f"c{next(ids)}", **kwargs)  # type: ignore[arg-type]


def codes(actions: list[Action]) -> list[str]:
    return [a.error.code for a in actions if isinstance(a, SendError)]


def frames(actions: list[Action]) -> list[dict[str, object]]:
    return [orjson.loads(a.frame) for a in actions if isinstance(a, SendFrame | SendError)]


# --- the wire ------------------------------------------------------------------------------------


def test_protocol_2_messages_name_their_context() -> None:
    assert msg({"type": "text", "context_id": "a", "delta": "Hi"}) == Text("Hi", "a")
    assert msg({"type": "flush", "context_id": "a"}) == Flush("a", None)
    assert msg({"type": "flush", "context_id": "a", "flush_id": 7}) == Flush("a", 7)
    assert msg({"type": "flush", "context_id": "a", "flush_id": "f-1"}) == Flush("a", "f-1")
    assert msg({"type": "close_context", "context_id": "a"}) == CloseContext("a")
    assert msg({"type": "cancel", "context_id": "a", "played_ms": 120}) == Cancel(120.0, "a")
    speak = msg({"type": "speak", "context_id": "turn-1", "buffering": "client", "voice": "v"})
    assert isinstance(speak, Speak)
    assert (speak.params.utterance_id, speak.buffering) == ("turn-1", Buffering.CLIENT)
    assert speak.params.voice == "v"
    default = msg({"type": "speak", "utterance_id": "u"})
    assert isinstance(default, Speak)
    assert (default.params.utterance_id, default.buffering) == ("u", Buffering.GATEWAY)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"type": "text", "delta": "Hi"}, "missing_context_id"),
        ({"type": "flush"}, "missing_context_id"),
        ({"type": "cancel"}, "missing_context_id"),
        ({"type": "close_context", "context_id": "a b"}, "invalid_field"),
        ({"type": "text", "context_id": "x" * 65, "delta": "Hi"}, "invalid_field"),
        ({"type": "flush", "context_id": "a", "flush_id": True}, "invalid_field"),
        ({"type": "flush", "context_id": "a", "flush_id": -1}, "invalid_field"),
        ({"type": "flush", "context_id": "a", "flush_id": ""}, "invalid_field"),
        ({"type": "flush", "context_id": "a", "flush_id": "x" * 65}, "invalid_field"),
        ({"type": "speak", "buffering": "sometimes"}, "invalid_field"),
        ({"type": "speak", "context_id": "a", "utterance_id": "b"}, "invalid_field"),
        ({"type": "close_context"}, "missing_context_id"),
        ({"type": "finish"}, "unknown_type"),
    ],
)
def test_protocol_2_refuses_what_it_cannot_act_on(body: dict[str, object], code: str) -> None:
    parsed = msg(body)
    assert isinstance(parsed, Invalid)
    assert parsed.error.code == code


def test_protocol_1_keeps_its_messages() -> None:
    """`close_context` is not protocol 1's, and its `flush` names nothing."""
    v1 = parse_client_message('{"type": "close_context", "context_id": "a"}')
    assert isinstance(v1, Invalid)
    assert v1.error.code == "unknown_type"
    assert parse_client_message('{"type": "flush"}') == Flush()


# --- contexts ----------------------------------------------------------------------------------


def test_contexts_open_side_by_side_and_each_takes_its_own_text() -> None:
    s = session()
    (a,) = s.receive(msg({"type": "speak", "context_id": "a", "voice": "v1"}), now=0.0)
    (b,) = s.receive(msg({"type": "speak", "context_id": "b", "speed": 1.2}), now=0.1)
    assert isinstance(a, StartUtterance)
    assert isinstance(b, StartUtterance)
    assert (a.utterance_id, a.client_text, a.params.voice) == ("a", True, "v1")
    assert (b.utterance_id, b.params.speed) == ("b", 1.2)
    assert s.open_ids == ("a", "b")
    assert s.receive(msg({"type": "text", "context_id": "b", "delta": "Two."})) == [
        FeedText("Two.", "b")
    ]
    assert s.receive(msg({"type": "text", "context_id": "a", "delta": "One."})) == [
        FeedText("One.", "a")
    ]
    assert s.receive(msg({"type": "flush", "context_id": "a", "flush_id": 1})) == [
        FeedText(FlushMark(1), "a")
    ]
    # a flush keeps the context open: more text, then its close
    assert s.receive(msg({"type": "text", "context_id": "a", "delta": " More."})) == [
        FeedText(" More.", "a")
    ]
    assert s.receive(msg({"type": "close_context", "context_id": "a"})) == [EndText("a")]
    closed = s.receive(msg({"type": "text", "context_id": "a", "delta": "late"}))
    assert codes(closed) == ["context_not_open"]
    assert frames(closed)[0][CONTEXT_KEY] == "a"
    # a's reply ends: the id may be used again
    assert s.utterance_ended("a", "One. More.") == []
    assert list(s.open_ids) == ["b"]
    (again,) = s.receive(msg({"type": "speak", "context_id": "a", "text": "Whole."}))
    assert isinstance(again, StartUtterance)
    assert not again.client_text
    given = s.receive(msg({"type": "text", "context_id": "a", "delta": "x"}))
    assert codes(given) == ["context_not_open"]  # its text was given whole


def test_an_id_in_use_and_contexts_past_the_cap_are_refused() -> None:
    s = session(max_contexts=2)
    s.receive(msg({"type": "speak", "context_id": "a"}))
    assert codes(s.receive(msg({"type": "speak", "context_id": "a"}))) == ["context_in_use"]
    s.receive(msg({"type": "speak"}))  # the server names it: c1
    assert s.open_ids == ("a", "c1")
    refused = s.receive(msg({"type": "speak", "context_id": "z"}))
    assert codes(refused) == ["too_many_contexts"]
    (error,) = frames(refused)
    assert (error["status"], error["retryable"], error[CONTEXT_KEY]) == (429, True, "z")
    assert s.open_ids == ("a", "c1")
    # one ends (refused at admission): room for one more
    s.start_failed("c1", refused[0].error)  # type: ignore[union-attr]
    (start,) = s.receive(msg({"type": "speak", "context_id": "z"}))
    assert isinstance(start, StartUtterance)


def test_unknown_contexts_are_refused_by_name() -> None:
    s = session()
    bodies: list[dict[str, object]] = [
        {"type": "text", "context_id": "nope", "delta": "Hi"},
        {"type": "flush", "context_id": "nope"},
        {"type": "close_context", "context_id": "nope"},
        {"type": "cancel", "context_id": "nope"},
    ]
    for body in bodies:
        actions = s.receive(msg(body))
        assert codes(actions) == ["unknown_context"]
        assert frames(actions)[0][CONTEXT_KEY] == "nope"


def test_a_cancel_stops_one_context_and_is_answered_when_it_has() -> None:
    s = session()
    s.receive(msg({"type": "speak", "context_id": "a", "prompt": "Tell me a story."}))
    s.receive(msg({"type": "speak", "context_id": "b"}))
    assert s.receive(msg({"type": "cancel", "context_id": "a", "played_ms": 500})) == [
        CancelUtterance("a", 500.0)
    ]
    (answer,) = s.utterance_cancelled("a", 500.0, "Once upon")
    assert isinstance(answer, SendFrame)
    assert orjson.loads(answer.frame) == {
        "type": "cancelled",
        CONTEXT_KEY: "a",
        "played_ms": 500.0,
        "heard_text": "Once upon",
    }
    assert s.open_ids == ("b",)
    assert s.history[-1]["content"].startswith("Once upon [interrupted")


def test_text_past_a_contexts_limit_is_refused_and_the_rest_kept() -> None:
    s = session(max_text_chars=10)
    s.receive(msg({"type": "speak", "context_id": "a"}))
    s.receive(msg({"type": "speak", "context_id": "b"}))
    assert s.receive(msg({"type": "text", "context_id": "a", "delta": "123456"})) == [
        FeedText("123456", "a")
    ]
    assert codes(s.receive(msg({"type": "text", "context_id": "a", "delta": "78901"}))) == [
        "text_too_long"
    ]
    # each context counts its own
    assert s.receive(msg({"type": "text", "context_id": "b", "delta": "0123456789"})) == [
        FeedText("0123456789", "b")
    ]


def test_a_context_waiting_for_text_past_its_idle_time_is_closed() -> None:
    s = session(idle_s=20.0)
    s.receive(msg({"type": "speak", "context_id": "a"}), now=0.0)
    s.receive(msg({"type": "speak", "context_id": "b"}), now=5.0)
    s.receive(msg({"type": "speak", "context_id": "given", "text": "Whole."}), now=5.0)
    assert s.expires_at() == 20.0  # a's; a context with its text given never idles
    s.receive(msg({"type": "text", "context_id": "a", "delta": "Hi"}), now=10.0)
    assert s.expires_at() == 25.0  # b's now
    assert s.expire(24.9, waiting=lambda _: True) == []
    # b is still synthesizing at 25: active, not idle
    assert s.expire(25.0, waiting=lambda cid: cid != "b") == []
    assert s.expires_at() == 30.0  # a's
    assert s.expire(45.0, waiting=lambda _: True) == [ExpireContext("a"), ExpireContext("b")]
    (closed,) = s.context_expired("a")
    assert isinstance(closed, SendFrame)
    assert orjson.loads(closed.frame) == {
        "type": "context_closed",
        CONTEXT_KEY: "a",
        "reason": "idle",
    }
    assert s.context_expired("a") == []  # once
    assert s.open_ids == ("b", "given")
    s.receive(msg({"type": "close_context", "context_id": "b"}), now=46.0)
    assert s.expires_at() == float("inf")  # its text closed: it ends with its audio


def test_close_ends_the_connection_and_nothing_after() -> None:
    s = session()
    assert s.receive(msg({"type": "close"})) == [CloseConnection()]
    assert s.receive(msg({"type": "speak"})) == []
