"""The shared client package (`integrations/client`, `kokoro_voice_client`), pure: URLs, the
speak WebSocket's messages and audio frames, the error rule, the SSE `data` decoder; and the
gateway's error frames carrying the `status` the clients read."""

from __future__ import annotations

import json

import pytest
from kokoro_voice_client import (
    Endpoints,
    GatewayError,
    SSEDataDecoder,
    endpoints,
    ends_context,
    ends_utterance,
    is_stale,
    speak_ws_url,
    split_audio_frame,
)
from kokoro_voice_client import speak_ws as msg

from gateway.errors import BadRequest, Overloaded, TTSError
from gateway.errors import GatewayError as ServerGatewayError
from gateway.reply.events import ErrorEvent
from gateway.speak_ws.protocol import error_frame, event_frame
from kokoro_contract import audio, formats
from tests.support.fakes import expected_pcm_bytes
from tests.support.servers import RunningServer


def test_every_url_shape_gives_the_same_two_routes() -> None:
    plain = Endpoints("ws://gw:8000/v1/speak/ws", "http://gw:8000/v1/audio/speech")
    for url in (
        "http://gw:8000",
        "http://gw:8000/",
        "http://gw:8000/v1",
        "http://gw:8000/v1/",
        "ws://gw:8000",
        "ws://gw:8000/v1/speak/ws",
        " http://gw:8000 ",
    ):
        assert endpoints(url) == plain, url
    assert endpoints("https://voice.example/tts") == Endpoints(
        "wss://voice.example/tts/v1/speak/ws", "https://voice.example/tts/v1/audio/speech"
    )
    assert speak_ws_url("wss://voice.example/v1/speak/ws") == "wss://voice.example/v1/speak/ws"
    for bad in ("gw:8000", "ftp://gw", "http://"):
        with pytest.raises(ValueError, match="gateway URL"):
            endpoints(bad)


def test_the_messages_are_the_protocols() -> None:
    assert msg.speak("u1", "jf_alpha", 1.5) == {
        "type": "speak",
        "utterance_id": "u1",
        "mode": "bidi",
        "format": "pcm",
        "speed": 1.5,
        "timestamps": True,
        "voice": "jf_alpha",
    }
    assert "voice" not in msg.speak("u1", None)
    # the rates the plugins may ask for are the gateway's (the client does not import it)
    assert msg.PCM_RATES == formats.PCM_RATES
    assert msg.SAMPLE_RATE == audio.SAMPLE_RATE
    # the model's rate is not named (a gateway that predates the field serves it); others are
    assert "sample_rate" not in msg.speak("u1", sample_rate=24_000)
    assert msg.speak("u1", sample_rate=16_000)["sample_rate"] == 16_000
    assert msg.speak("u1", timestamps=False)["timestamps"] is False
    assert msg.text("Hi ") == {"type": "text", "delta": "Hi "}
    assert msg.cancel() == {"type": "cancel"}
    assert msg.cancel(1234.6) == {"type": "cancel", "played_ms": 1235}
    assert msg.cancel(-3) == {"type": "cancel", "played_ms": 0}
    assert json.loads(msg.encode(msg.FLUSH)) == {"type": "flush"}
    assert msg.CLOSE == {"type": "close"}


def test_protocol_2s_messages_name_their_context() -> None:
    """Protocol 2's builders beside protocol 1's (unchanged), each naming its context, and
    parsed by the gateway's own protocol 2 parser as the messages they mean."""
    from gateway.params import Buffering
    from gateway.speak_ws.protocol import (
        Cancel,
        CloseContext,
        Flush,
        Speak,
        Text,
        parse_client_message,
    )

    speak = msg.speak_context("c1", "jf_alpha", 1.5, sample_rate=16_000)
    assert speak == {
        "type": "speak",
        "context_id": "c1",
        "mode": "bidi",
        "format": "pcm",
        "speed": 1.5,
        "timestamps": True,
        "voice": "jf_alpha",
        "sample_rate": 16_000,
    }
    assert "utterance_id" not in speak
    assert "buffering" not in speak
    assert msg.speak_context("c1", buffering="client")["buffering"] == "client"
    assert msg.context_text("c1", "Hi ") == {"type": "text", "context_id": "c1", "delta": "Hi "}
    assert msg.flush_context("c1") == {"type": "flush", "context_id": "c1"}
    assert msg.flush_context("c1", 7) == {"type": "flush", "context_id": "c1", "flush_id": 7}
    assert msg.close_context("c1") == {"type": "close_context", "context_id": "c1"}
    assert msg.cancel_context("c1") == {"type": "cancel", "context_id": "c1"}
    assert msg.cancel_context("c1", 1234.6) == {
        "type": "cancel",
        "context_id": "c1",
        "played_ms": 1235,
    }

    def parsed(message: dict[str, object]) -> object:
        return parse_client_message(msg.encode(message), version=msg.PROTOCOL_2)

    opened = parsed(msg.speak_context("c1", "jf_alpha", buffering="client"))
    assert isinstance(opened, Speak)
    assert opened.params.utterance_id == "c1"
    assert opened.buffering is Buffering.CLIENT
    assert parsed(msg.context_text("c1", "Hi ")) == Text("Hi ", "c1")
    assert parsed(msg.flush_context("c1", "f")) == Flush("c1", "f")
    assert parsed(msg.close_context("c1")) == CloseContext("c1")
    assert parsed(msg.cancel_context("c1", 10)) == Cancel(10.0, "c1")
    assert speak_ws_url("http://gw:8000", protocol=2) == "ws://gw:8000/v1/speak/ws?protocol=2"
    assert speak_ws_url("ws://gw:8000/v1/speak/ws", protocol=1) == "ws://gw:8000/v1/speak/ws"


def test_protocol_2s_error_rule_reads_the_context_an_error_names() -> None:
    refused = {"code": "unknown_voice", "context_id": "c1"}
    assert ends_context(refused, "c1", answered=False)
    assert not ends_context(refused, "c2", answered=False)  # another context's
    assert not ends_context(refused, "c1", answered=True)  # during its reply: agent_end follows
    assert not ends_context({"code": "text_too_long", "context_id": "c1"}, "c1", answered=False)
    assert ends_context({"code": "unknown_context", "context_id": "c1"}, "c1", answered=True)
    assert ends_context({"code": "idle_timeout"}, "c1", answered=True)
    assert not ends_context({"code": "invalid_field"}, "c1", answered=False)  # names none
    assert GatewayError.from_frame({"code": "x", "context_id": "c1"}).utterance_id == "c1"


def test_audio_frames_lose_their_prefix_and_nothing_else() -> None:
    pcm = b"{\x00" * 5  # PCM may start with a brace
    assert split_audio_frame(b"\x04lk_1" + pcm) == ("lk_1", pcm)
    assert split_audio_frame(b"\x02ab") == ("ab", b"")
    with pytest.raises(ValueError, match="shorter"):
        split_audio_frame(b"\x09abc")
    with pytest.raises(ValueError, match="empty"):
        split_audio_frame(b"")


def test_an_error_frame_keeps_its_code_status_and_retry() -> None:
    error = GatewayError.from_frame(
        {
            "type": "error",
            "code": "overloaded",
            "message": "too busy",
            "retryable": True,
            "status": 503,
            "retry_after_s": 3,
            "utterance_id": "u1",
        }
    )
    assert error == GatewayError("overloaded", "too busy", True, 503, "u1", 3.0)
    assert str(error) == "overloaded: too busy (retryable after 3 s)"
    # a gateway from before `status`
    assert GatewayError.from_frame({"code": "tts_not_ready"}).status == 502
    assert GatewayError.from_frame({"code": "unknown_voice"}).status == 500


def test_the_gateways_error_frames_carry_the_http_status_of_their_code() -> None:
    """What the clients read instead of a table of codes: each frame's `status` is the one
    the gateway's HTTP routes answer the error with."""
    for error, status in (
        (BadRequest("no", code="busy"), 400),
        (Overloaded("later", retry_after_s=2), 503),
        (TTSError("down", code="tts_not_ready"), 502),
        (ServerGatewayError("idle", code="idle_timeout", status=408), 408),
    ):
        frame = json.loads(error_frame(error, "u1"))
        assert frame["status"] == status, frame
        assert GatewayError.from_frame(frame).status == status
    during = json.loads(event_frame(ErrorEvent("tts_not_ready", "down", True, 502), "u1"))
    assert (during["type"], during["status"], during["utterance_id"]) == ("error", 502, "u1")


def error(code: str, uid: str | None = None) -> dict[str, object]:
    body: dict[str, object] = {"type": "error", "code": code, "message": "m"}
    if uid is not None:
        body["utterance_id"] = uid
    return body


def test_only_a_refused_speak_or_a_closing_connection_ends_the_utterance() -> None:
    # before the reply started: a refusal of our speak ends it
    assert ends_utterance(error("unknown_voice", "u1"), "u1", answered=False)
    assert ends_utterance(error("overloaded", "u1"), "u1", answered=False)
    assert ends_utterance(error("invalid_field"), "u1", answered=False)  # speak did not parse
    assert not ends_utterance(error("unknown_voice", "u0"), "u1", answered=False)  # not ours
    assert not ends_utterance(error("busy"), "u1", answered=False)  # some other message's
    assert not ends_utterance(error("text_too_long", "u1"), "u1", answered=False)
    # during the reply: agent_end follows
    for code in ("tts_synthesis_failed", "llm_error", "reply_too_long", "internal_error"):
        assert not ends_utterance(error(code, "u1"), "u1", answered=True)
    assert not ends_utterance(error("text_too_long", "u1"), "u1", answered=True)
    # the connection closes after it
    assert ends_utterance(error("idle_timeout"), "u1", answered=True)


def test_a_pooled_connection_answering_something_else_is_stale() -> None:
    assert is_stale(error("idle_timeout"))
    assert is_stale(error("busy"))
    assert is_stale(error("nothing_to_cancel"))
    assert not is_stale(error("unknown_voice", "u1"))
    assert not is_stale(error("invalid_field"))  # it refused our speak: a real answer


STREAM = (
    'data: {"type": "speech.audio.delta", "audio": "AAA="}\r\n\r\n'
    ": a comment\n\n"
    "event: ignored\nid: 7\n"
    'data: {"a":\ndata: "é"}\r\rdata:{"type": "speech.audio.done"}\n\n'
    "data: an event never ended"
).encode()
EVENTS = [
    '{"type": "speech.audio.delta", "audio": "AAA="}',
    '{"a":\n"é"}',
    '{"type": "speech.audio.done"}',
]


@pytest.mark.parametrize("size", [1, 2, 4, 7, len(STREAM)])
def test_sse_data_is_the_same_however_the_bytes_are_cut(size: int) -> None:
    decoder = SSEDataDecoder()
    found = [d for i in range(0, len(STREAM), size) for d in decoder.push(STREAM[i : i + size])]
    assert found == EVENTS
    assert decoder.flush() == []  # the unterminated event is dropped, as the spec says
    assert decoder.push(b"data: again\n\n") == ["again"]  # and the decoder starts over


def test_a_long_event_cut_into_many_chunks_is_whole() -> None:
    payload = "A" * 100_000
    stream = f"data: {payload}\n\n".encode()
    decoder = SSEDataDecoder()
    found = [d for i in range(0, len(stream), 3) for d in decoder.push(stream[i : i + 3])]
    assert found == [payload]


async def test_the_benchs_baseline_speaks_the_gateway_through_it(
    gateway_on_fake: RunningServer,
) -> None:
    """bench/frameworks/gateway_ws.py, the baseline the plugins are measured against, builds
    its messages and reads its audio frames with this package."""
    from bench.frameworks import gateway_ws

    text = "Hello there, my friend. Your order shipped today."
    measured = await gateway_ws.run(gateway_on_fake.http_url, None, text, "af_test")
    assert measured.words == tuple(text.split())
    chunks = ["Hello there, my friend.", "Your order shipped today."]
    assert round(measured.audio_s * 48_000) == sum(expected_pcm_bytes(c) for c in chunks)
