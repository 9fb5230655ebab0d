"""The gateway's speak WebSocket: its wire format (`gateway.speak_ws.protocol`) and its rules
(`gateway.speak_ws.session`), with literal messages and no server: busy, no open utterance,
client-streamed text, cancel, history, close."""

from __future__ import annotations

import itertools

import orjson
import pytest

from gateway.errors import BadRequest
from gateway.params import Mode
from gateway.reply.events import AgentStart
from gateway.speak_ws.protocol import (
    Cancel,
    ClientMessage,
    Close,
    Flush,
    Invalid,
    Speak,
    Text,
    audio_frame,
    event_frame,
    parse_client_message,
)
from gateway.speak_ws.session import (
    Action,
    CancelUtterance,
    CloseConnection,
    EndText,
    FeedText,
    SendError,
    SendFrame,
    SpeakSession,
    StartUtterance,
)


def session() -> SpeakSession:
    ids = itertools.count(1)
    return SpeakSession(new_id=lambda: f"u{next(ids)}")


def msg(text: str) -> ClientMessage:
    return parse_client_message(text)


def error_codes(actions: list[Action]) -> list[str]:
    return [a.error.code for a in actions if isinstance(a, SendError)]


# --- wire format --------------------------------------------------------------------------------


def test_parse_every_message_type() -> None:
    speak = msg('{"type": "speak", "text": "Hi.", "format": "pcm", "mode": "batch"}')
    assert isinstance(speak, Speak)
    assert (speak.params.text, speak.params.format, speak.params.mode) == ("Hi.", "pcm", Mode.BATCH)
    assert msg('{"type": "text", "delta": "Hel"}') == Text("Hel")
    assert msg('{"type": "flush"}') == Flush()
    assert msg('{"type": "cancel"}') == Cancel()
    assert msg('{"type": "close"}') == Close()


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (None, "binary_frame"),
        ("{", "invalid_json"),
        ("[1]", "not_an_object"),
        ('{"type": "dance"}', "unknown_type"),
        ("{}", "unknown_type"),
        ('{"type": "text"}', "invalid_field"),
        ('{"type": "text", "delta": 5}', "invalid_field"),
        ('{"type": "speak", "format": "aiff"}', "invalid_field"),
        ('{"type": "speak", "mode": "stream"}', "invalid_field"),
        ('{"type": "speak", "speed": 9}', "invalid_field"),
        ('{"type": "speak", "text": "a", "prompt": "b"}', "invalid_field"),
        ('{"type": "speak", "colour": "red"}', "invalid_field"),
    ],
)
def test_bad_frames_are_invalid_with_a_code(frame: str | None, code: str) -> None:
    parsed = parse_client_message(frame)
    assert isinstance(parsed, Invalid)
    assert parsed.error.code == code
    assert parsed.error.message


def test_server_frames() -> None:
    assert audio_frame("u1", b"\x7b\x00") == b"\x02u1\x7b\x00"
    assert orjson.loads(event_frame(AgentStart(Mode.BIDI, "u1"), "u1")) == {
        "type": "agent_start",
        "utterance_id": "u1",
        "mode": "bidi",
    }
    error = SendError(BadRequest("nothing to cancel", code="nothing_to_cancel"), "u1")
    assert orjson.loads(error.frame) == {
        "type": "error",
        "code": "nothing_to_cancel",
        "message": "nothing to cancel",
        "retryable": False,
        "status": 400,  # what the gateway's HTTP routes give the code: clients need no table
        "utterance_id": "u1",
    }


# --- rules ------------------------------------------------------------------------------------


def test_speak_starts_an_utterance_with_its_own_or_a_new_id() -> None:
    s = session()
    (start,) = s.receive(msg('{"type": "speak", "text": "Hi."}'))
    assert isinstance(start, StartUtterance)
    assert (start.utterance_id, start.client_text, start.history) == ("u1", False, ())
    assert s.utterance_id == "u1"
    s.utterance_ended("u1", "Hi.")
    (start,) = s.receive(msg('{"type": "speak", "text": "Hi.", "utterance_id": "mine"}'))
    assert isinstance(start, StartUtterance)
    assert start.utterance_id == "mine"


def test_speak_while_playing_is_busy_until_the_utterance_ends() -> None:
    s = session()
    s.receive(msg('{"type": "speak", "text": "One."}'))
    assert error_codes(s.receive(msg('{"type": "speak", "text": "Two."}'))) == ["busy"]
    assert s.utterance_id == "u1"
    assert s.utterance_ended("u1", "One.") == []
    (start,) = s.receive(msg('{"type": "speak", "text": "Two."}'))
    assert isinstance(start, StartUtterance)


def test_client_text_flows_only_into_an_open_utterance() -> None:
    s = session()
    assert error_codes(s.receive(msg('{"type": "text", "delta": "Hi"}'))) == ["no_open_utterance"]
    assert error_codes(s.receive(msg('{"type": "flush"}'))) == ["no_open_utterance"]
    (start,) = s.receive(msg('{"type": "speak"}'))
    assert isinstance(start, StartUtterance)
    assert start.client_text
    uid = start.utterance_id
    assert s.receive(msg('{"type": "text", "delta": "Hello "}')) == [FeedText("Hello ", uid)]
    assert s.receive(msg('{"type": "text", "delta": "there."}')) == [FeedText("there.", uid)]
    assert s.receive(msg('{"type": "flush"}')) == [EndText(uid)]
    # flushed: the utterance still plays, but takes no more text
    assert error_codes(s.receive(msg('{"type": "text", "delta": "x"}'))) == ["no_open_utterance"]
    assert error_codes(s.receive(msg('{"type": "flush"}'))) == ["no_open_utterance"]


def test_an_utterance_with_text_takes_no_client_text() -> None:
    s = session()
    s.receive(msg('{"type": "speak", "text": "Hi."}'))
    assert error_codes(s.receive(msg('{"type": "text", "delta": "x"}'))) == ["no_open_utterance"]


def test_cancel_stops_the_running_utterance_and_is_answered_after() -> None:
    s = session()
    assert error_codes(s.receive(msg('{"type": "cancel"}'))) == ["nothing_to_cancel"]
    s.receive(msg('{"type": "speak", "prompt": "Tell me a story."}'))
    assert s.receive(msg('{"type": "cancel"}')) == [CancelUtterance("u1")]
    assert s.utterance_cancelled("u1") == [SendFrame('{"type":"cancelled","utterance_id":"u1"}')]
    assert s.utterance_id is None
    assert s.history == []  # a cancelled reply is not kept
    assert error_codes(s.receive(msg('{"type": "cancel"}'))) == ["nothing_to_cancel"]


def test_a_cancel_that_races_the_end_is_still_answered() -> None:
    s = session()
    s.receive(msg('{"type": "speak", "text": "Hi."}'))
    assert s.receive(msg('{"type": "cancel"}')) == [CancelUtterance("u1")]
    s.utterance_ended("u1", "Hi.")  # the reply ended before the cancel took effect
    assert s.utterance_cancelled("u1") == [SendFrame('{"type":"cancelled","utterance_id":"u1"}')]


def test_history_keeps_prompts_with_what_was_spoken() -> None:
    s = session()
    s.receive(msg('{"type": "speak", "prompt": "Hi?"}'))
    s.utterance_ended("u1", "Hello!")
    s.receive(msg('{"type": "speak", "text": "Echo only."}'))  # no prompt: not a turn
    s.utterance_ended("u2", "Echo only.")
    (start,) = s.receive(msg('{"type": "speak", "prompt": "And now?"}'))
    assert isinstance(start, StartUtterance)
    assert start.history == (
        {"role": "user", "content": "Hi?"},
        {"role": "assistant", "content": "Hello!"},
    )


def test_a_failed_or_empty_reply_is_not_a_turn() -> None:
    s = session()
    s.receive(msg('{"type": "speak", "prompt": "Hi?"}'))
    s.utterance_ended("u1", "Hel", failed=True)  # the LLM failed half way
    s.receive(msg('{"type": "speak", "prompt": "Again?"}'))
    s.utterance_ended("u2", "  ")  # the LLM said nothing
    s.receive(msg('{"type": "speak", "prompt": "Once more?"}'))
    s.utterance_ended("u3", "Yes.")
    (start,) = s.receive(msg('{"type": "speak", "prompt": "Last?"}'))
    assert isinstance(start, StartUtterance)
    assert start.history == (
        {"role": "user", "content": "Once more?"},
        {"role": "assistant", "content": "Yes."},
    )


def test_history_keeps_the_newest_exchanges_within_its_size() -> None:
    ids = itertools.count(1)
    s = SpeakSession(new_id=lambda: f"u{next(ids)}", max_history_chars=30)
    for n in range(1, 4):
        s.receive(msg(f'{{"type": "speak", "prompt": "Question {n}?"}}'))  # 12 characters
        s.utterance_ended(f"u{n}", f"Answer {n}.")  # 9
    (start,) = s.receive(msg('{"type": "speak", "prompt": "Last?"}'))
    assert isinstance(start, StartUtterance)
    assert start.history == (  # 42 characters would pass 30: the oldest exchange went
        {"role": "user", "content": "Question 3?"},
        {"role": "assistant", "content": "Answer 3."},
    )


def test_client_text_past_its_limit_is_refused_and_the_rest_kept() -> None:
    ids = itertools.count(1)
    s = SpeakSession(new_id=lambda: f"u{next(ids)}", max_text_chars=10)
    s.receive(msg('{"type": "speak"}'))
    assert s.receive(msg('{"type": "text", "delta": "123456"}')) == [FeedText("123456", "u1")]
    (refused,) = s.receive(msg('{"type": "text", "delta": "78901"}'))
    assert isinstance(refused, SendError)
    assert (refused.error.code, refused.utterance_id) == ("text_too_long", "u1")
    assert s.receive(msg('{"type": "text", "delta": "7890"}')) == [FeedText("7890", "u1")]
    assert s.receive(msg('{"type": "flush"}')) == [EndText("u1")]


def test_a_refused_start_frees_the_session() -> None:
    s = session()
    s.receive(msg('{"type": "speak", "text": "Hi."}'))
    error = BadRequest("text is too long", code="text_too_long")
    assert s.start_failed("u1", error) == [SendError(error, "u1")]
    assert s.utterance_id is None


def test_close_ends_the_connection_and_later_messages_are_ignored() -> None:
    s = session()
    assert s.receive(msg('{"type": "close"}')) == [CloseConnection()]
    assert s.closed
    assert s.receive(msg('{"type": "speak", "text": "Hi."}')) == []
