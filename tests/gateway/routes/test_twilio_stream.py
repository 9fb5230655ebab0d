"""`WS /v1/twilio/ws`: the real gateway and a real model server (the controllable engine),
answered in Twilio's own messages, read back by pipecat's Twilio serializer (an implementation
of Twilio's side written by others) and checked against G.711 from its definition."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import orjson
import pytest
from pipecat.frames.frames import InputAudioRawFrame
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from gateway.twilio.media import FRAME_BYTES
from tests.gateway.twilio.test_media import mulaw_reference, pipecat_serializer
from tests.support.fakes import expected_pcm_bytes
from tests.support.servers import RunningServer

SID = "MZ00000000000000000000000000000001"


def ulaw_bytes(text: str) -> int:
    """The mu-law bytes (8000 Hz samples) of the fake engine's audio for `text`."""
    return expected_pcm_bytes(text) // 2 // 3


def whole_frames(n: int) -> int:
    return -(-n // FRAME_BYTES) * FRAME_BYTES


class Call:
    """The agent's side: what it would forward to Twilio (`event`s) and keep (`type`s)."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.to_twilio: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []

    async def send(self, body: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(body).decode())

    async def until(self, check: Any) -> dict[str, Any]:
        """The next frame that `check` takes (frames before it kept, as they came)."""
        async for frame in self.ws:
            assert isinstance(frame, str)  # no binary frames on a phone's stream
            message: dict[str, Any] = orjson.loads(frame)
            (self.to_twilio if "event" in message else self.events).append(message)
            if check(message):
                return message
        raise AssertionError("the connection closed")

    def media(self, since: int = 0) -> bytes:
        return b"".join(
            base64.b64decode(m["media"]["payload"])
            for m in self.to_twilio[since:]
            if m["event"] == "media"
        )


def is_mark(name: str) -> Any:
    return lambda m: m.get("event") == "mark" and m["mark"]["name"] == name


async def test_an_utterance_goes_to_the_phone_as_twilio_frames_then_its_mark(
    gateway_on_fake: RunningServer,
) -> None:
    text = "Hello from the phone."
    async with connect(gateway_on_fake.ws_url + f"/v1/twilio/ws?stream_sid={SID}") as ws:
        call = Call(ws)
        await call.send({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        await call.send({"type": "speak", "context_id": "t1", "text": text})
        await call.until(is_mark("t1"))
        frames = [m for m in call.to_twilio if m["event"] == "media"]
        assert {m["streamSid"] for m in call.to_twilio} == {SID}
        payloads = [base64.b64decode(m["media"]["payload"]) for m in frames]
        assert {len(p) for p in payloads} == {FRAME_BYTES}  # 20 ms each, the last padded
        ulaw = b"".join(payloads)
        assert len(ulaw) == whole_frames(ulaw_bytes(text))
        assert ulaw[ulaw_bytes(text) :] == b"\xff" * (len(ulaw) - ulaw_bytes(text))
        # pipecat's serializer, as a bot behind Twilio reads them: our samples, 8 kHz
        serializer = await pipecat_serializer()
        decoded = b""
        for message in frames:
            frame = await serializer.deserialize(orjson.dumps(message).decode())
            assert isinstance(frame, InputAudioRawFrame)
            assert frame.sample_rate == 8000
            decoded += frame.audio
        assert decoded == mulaw_reference(ulaw).tobytes()
        assert np.abs(np.frombuffer(decoded, "<i2")).max() > 10_000  # the square wave
        # the agent's own frames: protocol 2's, never forwarded (its end came before the
        # paced audio did)
        assert [e["type"] for e in call.events] == [
            "agent_start",
            "audio_stream_start",
            "text_delta",
            "audio_stream_end",
            "agent_end",
        ]
        start = next(e for e in call.events if e["type"] == "audio_stream_start")
        assert (start["format"], start["sample_rate"]) == ("ulaw_8000", 8000)
        # Twilio echoes the mark once the phone has played it: the agent forwards it
        await call.send(
            {"event": "mark", "streamSid": SID, "sequenceNumber": "4", "mark": {"name": "t1"}}
        )
        played = await call.until(lambda m: m.get("type") == "played")
        assert played == {
            "type": "played",
            "context_id": "t1",
            "audio_ms": ulaw_bytes(text) / 8,
            "played_ms": ulaw_bytes(text) / 8,
        }


async def test_a_barge_in_clears_the_phone_and_the_next_turn_follows(
    gateway_on_fake: RunningServer,
) -> None:
    long = "A long answer that the caller will interrupt before it ends. " * 3
    async with connect(gateway_on_fake.ws_url + f"/v1/twilio/ws?stream_sid={SID}") as ws:
        call = Call(ws)
        await call.send({"type": "speak", "context_id": "a", "text": long})
        await call.until(lambda m: m.get("event") == "media")  # paced: the rest still queued
        await call.send({"type": "speak", "context_id": "b", "text": "Yes?"})
        await call.send({"type": "cancel", "context_id": "a"})
        await call.until(lambda m: m.get("event") == "clear")
        cleared_at = len(call.to_twilio)
        await call.until(lambda m: m.get("type") == "cancelled" and m["context_id"] == "a")
        await call.until(is_mark("b"))
        # after the clear: b's audio alone, whole, then its mark; a's mark never came
        assert len(call.media(cleared_at)) == whole_frames(ulaw_bytes("Yes?"))
        assert not any(m["event"] == "mark" and m["mark"]["name"] == "a" for m in call.to_twilio)
        assert len(call.media()) < ulaw_bytes(long)  # a was cut short
        # Twilio gives back the marks a clear dropped: none here; a stray one is refused
        await call.send({"event": "mark", "streamSid": SID, "mark": {"name": "a"}})
        error = await call.until(lambda m: m.get("type") == "error")
        assert error["code"] == "unknown_mark"


async def test_contexts_opened_together_play_one_after_the_other(
    gateway_on_fake: RunningServer,
) -> None:
    async with connect(gateway_on_fake.ws_url + f"/v1/twilio/ws?stream_sid={SID}") as ws:
        call = Call(ws)
        await call.send({"type": "speak", "context_id": "one", "text": "First."})
        await call.send({"type": "speak", "context_id": "two", "text": "Second one."})
        await call.until(is_mark("two"))
        names = [m["mark"]["name"] for m in call.to_twilio if m["event"] == "mark"]
        assert names == ["one", "two"], call.events
        first_mark = next(i for i, m in enumerate(call.to_twilio) if m["event"] == "mark")
        before = len(call.media()) - len(call.media(first_mark))
        assert before == whole_frames(ulaw_bytes("First."))  # all of one, then the other
        assert len(call.media(first_mark)) == whole_frames(ulaw_bytes("Second one."))


async def test_the_turns_follow_the_order_contexts_were_opened_not_their_audio(
    gateway_on_fake: RunningServer,
) -> None:
    """`one` is opened first and waits for its text; `two`, opened next with its text, has
    its audio first, and is held until `one` has spoken (each context's audio had claimed the
    phone as it came: `two` played first, and a run with both given their text at once played
    them in whichever order their audio came). A context refused (an unknown voice) passes its
    turn on, with no mark."""
    async with connect(gateway_on_fake.ws_url + f"/v1/twilio/ws?stream_sid={SID}") as ws:
        call = Call(ws)
        await call.send({"type": "speak", "context_id": "one"})
        await call.send({"type": "speak", "context_id": "gone", "text": "No.", "voice": "nope"})
        await call.send({"type": "speak", "context_id": "two", "text": "Second one."})
        await call.until(lambda m: m.get("type") == "audio_stream_end" and m["context_id"] == "two")
        assert [m["event"] for m in call.to_twilio] == []  # held: `one` has the phone
        await call.send({"type": "text", "context_id": "one", "delta": "First."})
        await call.send({"type": "close_context", "context_id": "one"})
        await call.until(is_mark("two"))
        names = [m["mark"]["name"] for m in call.to_twilio if m["event"] == "mark"]
        assert names == ["one", "two"]
        errors = [(m["context_id"], m["code"]) for m in call.events if m["type"] == "error"]
        assert errors == [("gone", "unknown_voice")]
        first_mark = next(i for i, m in enumerate(call.to_twilio) if m["event"] == "mark")
        before = len(call.media()) - len(call.media(first_mark))
        assert before == whole_frames(ulaw_bytes("First."))
        assert len(call.media(first_mark)) == whole_frames(ulaw_bytes("Second one."))


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"type": "speak", "text": "Hi.", "format": "mp3"}, "invalid_field"),
        ({"event": "mark", "streamSid": "MZother", "mark": {"name": "x"}}, "foreign_stream"),
        ({"event": "hangup", "streamSid": SID}, "unknown_event"),
    ],
)
async def test_what_the_stream_cannot_take_is_refused_and_it_goes_on(
    gateway_on_fake: RunningServer, body: dict[str, Any], code: str
) -> None:
    async with connect(gateway_on_fake.ws_url + f"/v1/twilio/ws?stream_sid={SID}") as ws:
        call = Call(ws)
        await call.send(body)
        error = await call.until(lambda m: m.get("type") == "error")
        assert error["code"] == code
        await call.send({"type": "speak", "context_id": "ok", "text": "Still here."})
        await call.until(is_mark("ok"))


async def test_a_stream_without_its_sid_is_refused_before_the_upgrade(
    gateway_on_fake: RunningServer,
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(gateway_on_fake.ws_url + "/v1/twilio/ws"):
            pass
    assert refused.value.response.status_code == 400
