"""The model server's bidirectional session rules (`model_server.bidi_session`), with literal
messages and no server: ordering, duplicates, the pending limit, cancel of queued and running
requests, close."""

from __future__ import annotations

import orjson
import pytest

from kokoro_contract.protocol import Cancel, Close, ProtocolError, SynthesisRequest
from model_server.bidi_session import (
    AbortSynthesis,
    Action,
    BidiSession,
    CloseSession,
    Send,
    StartSynthesis,
)


def req(rid: str) -> SynthesisRequest:
    return SynthesisRequest(f"Text {rid}.", "jf_alpha", 1.0, rid)


def frames(actions: list[Action]) -> list[dict[str, object]]:
    return [orjson.loads(a.frame) for a in actions if isinstance(a, Send)]


def test_the_first_request_starts_at_once() -> None:
    session = BidiSession(max_pending=4)
    actions = session.receive(req("a"))
    assert actions == [
        Send('{"type":"synthesis_start","request_id":"a"}'),
        StartSynthesis(req("a")),
    ]
    assert session.pending_ids == ["a"]


def test_requests_run_one_at_a_time_in_arrival_order() -> None:
    session = BidiSession(max_pending=4)
    session.receive(req("a"))
    assert session.receive(req("b")) == []  # queued behind a
    assert session.receive(req("c")) == []
    assert session.pending_ids == ["a", "b", "c"]
    actions = session.synthesis_finished("a", audio_bytes=48_000, elapsed_s=0.5)
    assert frames(actions) == [
        {
            "type": "synthesis_complete",
            "request_id": "a",
            "total_duration_s": 1.0,
            "elapsed_s": 0.5,
            "audio_bytes": 48_000,
        },
        {"type": "synthesis_start", "request_id": "b"},
    ]
    assert actions[-1] == StartSynthesis(req("b"))
    actions = session.synthesis_failed("b", "synthesis_failed", "boom")
    assert frames(actions)[0] == {
        "type": "error",
        "request_id": "b",
        "code": "synthesis_failed",
        "message": "boom",
    }
    assert actions[-1] == StartSynthesis(req("c"))
    assert session.synthesis_finished("c", 2, 0.1)[1:] == []  # nothing left to start
    assert session.pending_ids == []


def test_a_duplicate_id_is_refused_while_pending_and_allowed_after() -> None:
    session = BidiSession(max_pending=4)
    session.receive(req("a"))
    session.receive(req("b"))
    for rid in ("a", "b"):
        (error,) = frames(session.receive(req(rid)))
        assert (error["code"], error["request_id"]) == ("duplicate_request_id", rid)
    assert session.pending_ids == ["a", "b"]
    session.synthesis_finished("a", 2, 0.1)
    assert StartSynthesis(req("a")) not in session.receive(req("a"))  # queued again behind b
    assert session.pending_ids == ["b", "a"]


def test_the_pending_limit_counts_the_running_request() -> None:
    session = BidiSession(max_pending=2)
    session.receive(req("a"))
    session.receive(req("b"))
    (error,) = frames(session.receive(req("c")))
    assert error["code"] == "too_many_pending"
    assert error["request_id"] == "c"
    session.synthesis_finished("a", 2, 0.1)
    assert frames(session.receive(req("c"))) == []  # room again
    assert session.pending_ids == ["b", "c"]


def test_cancel_a_queued_request_answers_at_once() -> None:
    session = BidiSession(max_pending=4)
    session.receive(req("a"))
    session.receive(req("b"))
    session.receive(req("c"))
    assert frames(session.receive(Cancel("b"))) == [
        {"type": "synthesis_cancelled", "request_id": "b"}
    ]
    assert session.pending_ids == ["a", "c"]
    assert session.synthesis_finished("a", 2, 0.1)[-1] == StartSynthesis(req("c"))


def test_cancel_the_running_request_aborts_it_and_answers_when_it_stopped() -> None:
    session = BidiSession(max_pending=4)
    session.receive(req("a"))
    session.receive(req("b"))
    assert session.receive(Cancel("a")) == [AbortSynthesis("a")]
    assert session.receive(Cancel("a")) == []  # already being aborted: no second abort
    actions = session.synthesis_cancelled("a")
    assert frames(actions) == [
        {"type": "synthesis_cancelled", "request_id": "a"},
        {"type": "synthesis_start", "request_id": "b"},
    ]
    assert actions[-1] == StartSynthesis(req("b"))


def test_cancel_all_drops_the_queue_and_aborts_the_running_one() -> None:
    session = BidiSession(max_pending=4)
    for rid in "abc":
        session.receive(req(rid))
    actions = session.receive(Cancel(None))
    assert frames(actions) == [
        {"type": "synthesis_cancelled", "request_id": "b"},
        {"type": "synthesis_cancelled", "request_id": "c"},
    ]
    assert actions[-1] == AbortSynthesis("a")
    assert session.synthesis_cancelled("a")[1:] == []
    assert session.pending_ids == []


def test_cancel_of_an_unknown_id_is_an_error_and_cancel_all_of_nothing_is_not() -> None:
    session = BidiSession(max_pending=4)
    (error,) = frames(session.receive(Cancel("zz")))
    assert (error["code"], error["request_id"]) == ("unknown_request_id", "zz")
    assert session.receive(Cancel(None)) == []


def test_a_protocol_error_is_answered_and_changes_nothing() -> None:
    session = BidiSession(max_pending=4)
    session.receive(req("a"))
    actions = session.receive(ProtocolError("invalid_json", "message is not valid JSON"))
    assert frames(actions) == [
        {"type": "error", "code": "invalid_json", "message": "message is not valid JSON"}
    ]
    assert session.pending_ids == ["a"]


def test_close_ends_the_session_and_nothing_starts_after() -> None:
    session = BidiSession(max_pending=4)
    session.receive(req("a"))
    session.receive(req("b"))
    assert session.receive(Close()) == [CloseSession()]
    assert session.closed
    assert session.receive(req("c")) == []
    assert frames(session.synthesis_finished("a", 2, 0.1)) == [
        {
            "type": "synthesis_complete",
            "request_id": "a",
            "total_duration_s": 0.0,
            "elapsed_s": 0.1,
            "audio_bytes": 2,
        }
    ]  # b is not started: the session is closing


def test_an_outcome_for_a_request_that_is_not_running_is_a_bug() -> None:
    session = BidiSession(max_pending=4)
    session.receive(req("a"))
    with pytest.raises(RuntimeError, match="'b' is not the one running"):
        session.synthesis_finished("b", 2, 0.1)
