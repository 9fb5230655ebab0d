from __future__ import annotations

import orjson
import pytest

from kokoro_contract import protocol
from kokoro_contract.protocol import (
    Cancel,
    Close,
    ProtocolError,
    RequestRules,
    SynthesisRequest,
    parse_client_message,
    parse_control,
)

RULES = RequestRules(
    voices=frozenset({"jf_alpha", "af_heart"}), default_voice="jf_alpha", max_text_chars=20
)


def test_text_and_binary_frames_parse_alike() -> None:
    raw = '{"text": "Hello there.", "voice": "af_heart", "speed": 1.25, "request_id": "r1"}'
    expected = SynthesisRequest("Hello there.", "af_heart", 1.25, "r1")
    assert parse_client_message(raw, RULES) == expected
    assert parse_client_message(raw.encode(), RULES) == expected


def test_defaults_fill_voice_speed_and_request_id() -> None:
    msg = parse_client_message(b'{"text": "Hi."}', RULES)
    assert isinstance(msg, SynthesisRequest)
    assert (msg.voice, msg.speed) == ("jf_alpha", 1.0)
    assert len(msg.request_id) == 32
    other = parse_client_message(b'{"text": "Hi."}', RULES)
    assert isinstance(other, SynthesisRequest)
    assert other.request_id != msg.request_id


def test_explicit_synthesize_type_and_integer_speed() -> None:
    msg = parse_client_message('{"type": "synthesize", "text": "Hi.", "speed": 2}', RULES)
    assert isinstance(msg, SynthesisRequest)
    assert msg.speed == 2.0


def test_control_messages() -> None:
    assert parse_client_message('{"type": "close"}', RULES) == Close()
    assert parse_client_message('{"type": "cancel", "request_id": "r1"}', RULES) == Cancel("r1")
    assert parse_client_message(b'{"type": "cancel"}', RULES) == Cancel(None)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"\xff\xfe{", "invalid_utf8"),
        ('{"text": "Hi."', "invalid_json"),
        ("", "invalid_json"),
        ('["text"]', "not_an_object"),
        ('"Hello"', "not_an_object"),
        ("{}", "missing_text"),
        ('{"text": 5}', "invalid_field"),
        ('{"text": "   "}', "empty_text"),
        ('{"text": "' + "a" * 21 + '"}', "text_too_long"),
        ('{"text": "Hi.", "voice": "nobody"}', "unknown_voice"),
        ('{"text": "Hi.", "voice": 3}', "invalid_field"),
        ('{"text": "Hi.", "speed": 0.1}', "invalid_speed"),
        ('{"text": "Hi.", "speed": 9}', "invalid_speed"),
        ('{"text": "Hi.", "speed": "fast"}', "invalid_speed"),
        ('{"text": "Hi.", "speed": true}', "invalid_speed"),
        ('{"text": "Hi.", "speed": NaN}', "invalid_json"),
        ('{"text": "Hi.", "request_id": 7}', "invalid_field"),
        ('{"type": "dance", "request_id": "r9"}', "unknown_type"),
        ('{"type": "cancel", "request_id": 4}', "invalid_field"),
    ],
)
def test_bad_input_is_a_protocol_error(frame: str | bytes, code: str) -> None:
    msg = parse_client_message(frame, RULES)
    assert isinstance(msg, ProtocolError)
    assert msg.code == code
    assert msg.message
    event = orjson.loads(msg.encode())
    assert event["type"] == "error"
    assert event["code"] == code


def test_errors_name_the_request_when_known() -> None:
    msg = parse_client_message('{"text": "", "request_id": "abc"}', RULES)
    assert isinstance(msg, ProtocolError)
    assert orjson.loads(msg.encode())["request_id"] == "abc"
    unknown = parse_client_message('{"type": "dance", "request_id": "r9"}', RULES)
    assert isinstance(unknown, ProtocolError)
    assert unknown.request_id == "r9"


def test_server_events() -> None:
    assert orjson.loads(protocol.StartMsg("r").encode()) == {
        "type": "synthesis_start",
        "request_id": "r",
    }
    done = orjson.loads(protocol.CompleteMsg("r", audio_bytes=48_000, elapsed_s=0.25).encode())
    assert done == {
        "type": "synthesis_complete",
        "request_id": "r",
        "total_duration_s": 1.0,
        "elapsed_s": 0.25,
        "audio_bytes": 48_000,
    }
    assert orjson.loads(protocol.CancelledMsg("r").encode())["type"] == "synthesis_cancelled"
    assert "request_id" not in orjson.loads(protocol.ErrorMsg("x", "y").encode())


def test_frame_rule_control_is_a_whole_json_object() -> None:
    assert parse_control(protocol.StartMsg("r").encode()) == {
        "type": "synthesis_start",
        "request_id": "r",
    }
    assert parse_control(protocol.CompleteMsg("r", 2, 0.1).encode().encode()) is not None
    # PCM whose first byte is 0x7B ('{') is audio, not control
    assert parse_control(b"{\x00\x10\xff\x7b\x00") is None
    assert parse_control(b'{"type": "synthesis_start"') is None  # cut mid-object
    assert parse_control(b"[1, 2]") is None
    assert parse_control(b'{"no_type": 1}') is None
    assert parse_control(b"") is None


def test_client_messages_parse_back_on_the_server() -> None:
    frame = protocol.synthesize_message("Hi.", "r1", voice="af_heart", speed=1.5)
    assert parse_client_message(frame.encode(), RULES) == SynthesisRequest(
        "Hi.", "af_heart", 1.5, "r1"
    )
    defaults = parse_client_message(protocol.synthesize_message("Hi.", "r2"), RULES)
    assert defaults == SynthesisRequest("Hi.", "jf_alpha", 1.0, "r2")
    assert parse_client_message(protocol.cancel_message("r1"), RULES) == Cancel("r1")
    assert parse_client_message(protocol.cancel_message(), RULES) == Cancel(None)
    assert parse_client_message(protocol.close_message(), RULES) == Close()


def test_server_frames_read_back_on_the_client() -> None:
    words = (protocol.WordTiming("Hello", 0.0, 0.325), protocol.WordTiming("$5", 0.325, 1.2))
    sent: list[
        protocol.StartMsg
        | protocol.CompleteMsg
        | protocol.CancelledMsg
        | protocol.ErrorMsg
        | protocol.WordTimingsMsg
    ] = [
        protocol.StartMsg("r"),
        protocol.WordTimingsMsg("r", words),
        protocol.CompleteMsg("r", audio_bytes=4_800, elapsed_s=0.25),
        protocol.CancelledMsg("r"),
        protocol.ErrorMsg("unknown_voice", "no such voice", "r"),
        protocol.ErrorMsg("not_ready", "loading"),
    ]
    for message in sent:
        assert protocol.read_server_frame(message.encode()) == message
        assert protocol.read_server_frame(message.encode().encode()) == message  # binary too
    pcm = b"{\x00\x10\xff"
    assert protocol.read_server_frame(pcm) == pcm  # audio that starts like JSON
    newer = protocol.read_server_frame('{"type": "emotion", "mood": "calm"}')
    assert newer == protocol.UnknownMsg("emotion", {"type": "emotion", "mood": "calm"})


def test_word_timings_read_leniently() -> None:
    frame = orjson.dumps(
        {
            "type": "word_timings",
            "request_id": "r",
            "words": [
                {"word": "Hi", "start_s": 0, "end_s": 0.2},
                {"word": "bad", "start_s": "0.2"},
                ["not", "a", "word"],
                {"word": "there", "start_s": 0.2, "end_s": True},
                {"word": "friend", "start_s": 0.25, "end_s": 0.6},
            ],
        }
    )
    assert protocol.read_server_frame(frame) == protocol.WordTimingsMsg(
        "r", (protocol.WordTiming("Hi", 0.0, 0.2), protocol.WordTiming("friend", 0.25, 0.6))
    )


def test_timestamps_is_a_flag() -> None:
    rules = protocol.RequestRules(frozenset({"af_heart"}), "af_heart")
    asked = protocol.validate_synthesis({"text": "Hi.", "timestamps": True}, rules)
    assert isinstance(asked, protocol.SynthesisRequest)
    assert asked.timestamps
    plain = protocol.validate_synthesis({"text": "Hi."}, rules)
    assert isinstance(plain, protocol.SynthesisRequest)
    assert not plain.timestamps
    wrong = protocol.validate_synthesis({"text": "Hi.", "timestamps": "yes"}, rules)
    assert isinstance(wrong, protocol.ProtocolError)
    assert wrong.code == "invalid_field"
    assert '"timestamps":true' in protocol.synthesize_message("Hi.", "r", timestamps=True)
    assert protocol.invocation_body("Hi.", None, 1.0, timestamps=True)["stream"] is False
