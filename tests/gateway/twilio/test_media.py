"""Twilio Media Streams, pure (`gateway.twilio.media`), with literal bytes, messages and `now`
values (no sleeping, no clock): 160-byte frames padded with 0xFF, the pacing rule, marks after
an utterance's last frame and their echoes as the played position, barge-in's `clear`; and
pipecat's own Twilio serializer reading our messages and writing one our parser reads."""

from __future__ import annotations

import base64
import io
import math
from typing import Any

import av
import numpy as np
import orjson
import pytest
from pipecat.clocks.system_clock import SystemClock
from pipecat.frames.frames import InputAudioRawFrame, InterruptionFrame, OutputAudioRawFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameProcessorSetup
from pipecat.serializers.twilio import TwilioFrameSerializer
from pipecat.utils.asyncio.task_manager import TaskManager

from gateway.encoders import create_encoder
from gateway.speak_ws.protocol import Invalid
from gateway.twilio.media import (
    Connected,
    Dtmf,
    Mark,
    Media,
    MulawFramer,
    Pacer,
    Start,
    Stop,
    TwilioStream,
    UtteranceCleared,
    UtterancePlayed,
    UtteranceState,
    clear_message,
    mark_message,
    media_message,
    parse_twilio_message,
)
from kokoro_contract.formats import FORMATS

SID = "MZ0123456789abcdef0123456789abcdef"
OTHER_SID = "MZffffffffffffffffffffffffffffffff"


def loads(text: str) -> Any:
    return orjson.loads(text)


def payload(text: str) -> bytes:
    msg = loads(text)
    assert msg["event"] == "media"
    assert msg["streamSid"] == SID
    return base64.b64decode(msg["media"]["payload"], validate=True)


def echo(name: str, sid: str = SID, seq: str = "4") -> str:
    """A mark's echo as Twilio sends it."""
    body = {"event": "mark", "sequenceNumber": seq, "streamSid": sid, "mark": {"name": name}}
    return orjson.dumps(body).decode()


def code(result: object) -> str:
    assert isinstance(result, Invalid), result
    return result.error.code


# --- the messages to Twilio ---------------------------------------------------------------------


def test_messages_to_twilio_are_its_schema() -> None:
    assert media_message(SID, b"\x00\x7f\xff") == (
        '{"event":"media","streamSid":"' + SID + '","media":{"payload":"AH//"}}'
    )
    assert mark_message(SID, "u1") == (
        '{"event":"mark","streamSid":"' + SID + '","mark":{"name":"u1"}}'
    )
    assert clear_message(SID) == '{"event":"clear","streamSid":"' + SID + '"}'
    audio = bytes(range(256)) + b"\x01\x02"
    assert payload(media_message(SID, audio)) == audio


# --- framing ------------------------------------------------------------------------------------


def test_framer_gives_whole_frames_and_carries_the_remainder() -> None:
    framer = MulawFramer()
    assert framer.push(bytes(range(100))) == []
    assert framer.pending == 100
    frames = framer.push(bytes(range(100, 200)))  # 200 bytes in: one frame, 40 waiting
    assert frames == [bytes(range(160))]
    assert framer.pending == 40
    frames = framer.push(bytes(range(200, 256)) + bytes(range(256)) + bytes(range(8)))  # 40 + 320
    assert [len(f) for f in frames] == [160, 160]
    assert frames[0] == bytes(range(160, 256)) + bytes(range(64))
    assert frames[1] == bytes(range(64, 224))
    assert framer.pending == 40
    assert framer.flush() == [bytes(range(224, 256)) + bytes(range(8)) + b"\xff" * 120]
    assert framer.pending == 0
    assert framer.flush() == []  # nothing left: no frame of silence


def test_framer_streamed_in_any_pieces_equals_one_shot() -> None:
    data = bytes(i % 251 for i in range(1_000))  # 6 frames and 40 bytes
    one_shot = MulawFramer()
    expected = one_shot.push(data) + one_shot.flush()
    assert len(expected) == 7
    assert b"".join(expected) == data + b"\xff" * 120
    for size in (1, 2, 7, 159, 160, 161, 333):
        framer = MulawFramer()
        frames: list[bytes] = []
        for i in range(0, len(data), size):
            frames += framer.push(data[i : i + size])
        assert frames + framer.flush() == expected, size


def test_framer_clear_drops_the_remainder() -> None:
    framer = MulawFramer()
    framer.push(b"\x11" * 150)
    framer.clear()
    assert framer.pending == 0
    assert framer.flush() == []
    assert framer.push(b"\x22" * 160) == [b"\x22" * 160]


# --- pacing -------------------------------------------------------------------------------------


def test_pacer_sends_the_leads_worth_then_one_per_20_ms() -> None:
    pacer = Pacer(lead_s=0.2)
    assert pacer.lead_frames == 10
    assert pacer.due_at() == -math.inf  # nothing sent yet: at once
    assert pacer.take(100.0, 50) == 10
    assert pacer.take(100.0, 40) == 0
    assert pacer.due_at() == pytest.approx(100.02)
    assert pacer.take(100.019, 40) == 0
    assert pacer.take(100.02, 40) == 1
    assert pacer.take(100.1, 39) == 4  # 15 in all by 100.1: 5 played, 10 ahead
    assert pacer.due_at() == pytest.approx(100.12)
    assert pacer.take(100.25, 35) == 7  # 22 by 100.25: 12 played, 10 ahead
    assert pacer.take(100.5, 28) == 10  # all 22 played by 100.44: dry, a fresh lead only
    assert pacer.take(100.5, 0) == 0


def test_pacer_after_a_dry_spell_sends_no_more_than_the_lead() -> None:
    pacer = Pacer(lead_s=0.2)
    assert pacer.take(100.0, 3) == 3  # 60 ms sent: played out by 100.06
    assert pacer.take(105.0, 100) == 10  # not 250 for the 5 s of silence
    assert pacer.take(105.0, 90) == 0
    assert pacer.take(105.02, 90) == 1
    assert pacer.due_at() == pytest.approx(105.04)
    # not quite dry: 11 sent from 105.0 have played by 105.22; at 105.2 one frame is left at
    # the far end, so 9 may go
    assert pacer.take(105.2, 89) == 9
    assert pacer.take(105.2, 80) == 0


def test_pacer_lead_is_at_least_a_frame_and_clear_restarts_it() -> None:
    for bad in (0.0, 0.019, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="lead_s"):
            Pacer(lead_s=bad)
    one = Pacer(lead_s=0.02)
    assert one.take(0.0, 5) == 1
    assert one.take(0.01, 5) == 0
    assert one.take(0.02, 5) == 1
    assert Pacer(lead_s=0.05).lead_frames == 2  # whole frames only
    pacer = Pacer(lead_s=0.1)
    assert pacer.take(7.0, 20) == 5
    pacer.clear()  # Twilio's buffer emptied: a fresh lead at once
    assert pacer.due_at() == -math.inf
    assert pacer.take(7.0, 20) == 5


# --- the stream ---------------------------------------------------------------------------------


def test_stream_sends_frames_then_the_mark_after_the_last() -> None:
    stream = TwilioStream(SID, lead_s=0.2)
    stream.audio("u1", b"\x01" * 100)
    assert stream.due_at() is None  # no whole frame yet
    assert stream.send_now(10.0) == []
    stream.audio("u1", b"\x02" * 300)  # 400 bytes: two frames, 80 waiting
    stream.utterance_end("u1")  # the 80 padded: a third frame, then the mark
    assert stream.due_at() == -math.inf
    out = stream.send_now(10.0)
    assert len(out) == 4
    assert payload(out[0]) == b"\x01" * 100 + b"\x02" * 60
    assert payload(out[1]) == b"\x02" * 160
    assert payload(out[2]) == b"\x02" * 80 + b"\xff" * 80
    assert out[3] == mark_message(SID, "u1")
    assert stream.due_at() is None
    state = stream.utterance("u1")
    assert state == UtteranceState("u1", sent_ms=50.0, ended=True, played=False, cleared=False)
    assert stream.utterance("u2") is None


def test_stream_paces_frames_and_holds_the_mark_until_its_frame_goes() -> None:
    stream = TwilioStream(SID, lead_s=0.1)
    stream.audio("u1", bytes(range(256)) * 5)  # 1280 bytes: 8 frames
    stream.utterance_end("u1")
    out = stream.send_now(50.0)
    assert len(out) == 5  # the lead's worth
    assert b"".join(payload(m) for m in out) == (bytes(range(256)) * 5)[:800]
    assert stream.due_at() == pytest.approx(50.02)
    assert stream.send_now(50.01) == []
    assert len(stream.send_now(50.02)) == 1
    last = stream.send_now(50.06)  # the last two frames, the mark with them
    assert [loads(m)["event"] for m in last] == ["media", "media", "mark"]
    assert loads(last[2])["mark"] == {"name": "u1"}
    assert stream.utterance("u1") == UtteranceState("u1", 160.0, True, False, False)


def test_stream_marks_follow_each_utterance_in_order() -> None:
    stream = TwilioStream(SID, lead_s=0.2)
    stream.audio("a", b"\x10" * 160)
    stream.utterance_end("a")
    stream.utterance_end("empty")  # no audio: its mark alone
    stream.audio("b", b"\x20" * 20)
    stream.utterance_end("b")
    events = [(m["event"], m.get("mark")) for m in map(loads, stream.send_now(0.0))]
    assert events == [
        ("media", None),
        ("mark", {"name": "a"}),
        ("mark", {"name": "empty"}),
        ("media", None),
        ("mark", {"name": "b"}),
    ]


def test_stream_after_a_dry_spell_sends_no_burst() -> None:
    stream = TwilioStream(SID, lead_s=0.2)
    stream.audio("a", b"\x10" * 160 * 2)
    stream.utterance_end("a")
    assert len(stream.send_now(0.0)) == 3  # two frames and the mark
    stream.audio("b", b"\x20" * 160 * 30)  # 3 s later: 30 frames
    assert len(stream.send_now(3.0)) == 10
    assert stream.due_at() == pytest.approx(3.02)


def test_played_position_from_the_marks_echoes() -> None:
    stream = TwilioStream(SID)
    stream.audio("a", b"\x10" * 400)  # 50 ms: 400 bytes, padded to 480
    stream.utterance_end("a")
    stream.audio("b", b"\x20" * 160)  # 20 ms
    stream.utterance_end("b")
    stream.send_now(0.0)
    assert stream.played_ms == 0.0
    assert stream.received(echo("a", seq="7")) == UtterancePlayed("a", 50.0, 50.0)
    assert stream.utterance("a") == UtteranceState("a", 50.0, True, True, False)
    assert stream.played_ms == 50.0
    assert stream.received(echo("b", seq="8")) == UtterancePlayed("b", 20.0, 70.0)
    assert stream.played_ms == 70.0


def test_unknown_repeated_unsent_and_foreign_marks_are_refused() -> None:
    stream = TwilioStream(SID, lead_s=0.02)
    stream.audio("a", b"\x10" * 320)  # two frames; a lead of one
    stream.utterance_end("a")
    assert len(stream.send_now(0.0)) == 1
    assert code(stream.received(echo("a"))) == "unknown_mark"  # its mark is still queued
    assert code(stream.received(echo("nobody"))) == "unknown_mark"
    assert len(stream.send_now(0.02)) == 2  # the frame, the mark
    foreign = stream.received(echo("a", sid=OTHER_SID))
    assert code(foreign) == "foreign_stream"
    assert isinstance(foreign, Invalid)
    assert OTHER_SID in foreign.error.message
    assert stream.received(echo("a")) == UtterancePlayed("a", 40.0, 40.0)
    assert code(stream.received(echo("a"))) == "unknown_mark"  # echoed already
    assert stream.played_ms == 40.0


def test_barge_in_clears_queue_remainder_and_pacer() -> None:
    stream = TwilioStream(SID, lead_s=0.1)
    stream.audio("a", b"\x10" * 160 * 20 + b"\x11" * 50)  # 20 frames and 50 waiting
    assert len(stream.send_now(0.0)) == 5
    assert stream.barge_in() == clear_message(SID)
    assert stream.due_at() is None
    assert stream.send_now(0.05) == []
    assert stream.utterance("a") == UtteranceState("a", 100.0, False, False, True)
    # the cancelled utterance's late audio and end are dropped
    stream.audio("a", b"\x12" * 1_000)
    stream.utterance_end("a")
    assert stream.send_now(0.06) == []
    # the next utterance: none of the old remainder, and a fresh lead at once
    stream.audio("b", b"\x20" * 160 * 8)
    stream.utterance_end("b")
    out = stream.send_now(0.06)
    assert len(out) == 5
    assert all(payload(m) == b"\x20" * 160 for m in out)


def test_marks_cleared_by_a_barge_in_come_back_as_cleared_not_played() -> None:
    stream = TwilioStream(SID, lead_s=0.2)
    stream.audio("a", b"\x10" * 160)
    stream.utterance_end("a")
    stream.audio("b", b"\x20" * 160 * 3)
    stream.utterance_end("b")
    stream.audio("c", b"\x30" * 160 * 20)
    stream.utterance_end("c")
    assert len(stream.send_now(0.0)) == 12  # a (frame, mark), b (3 frames, mark), 6 of c
    assert stream.received(echo("a")) == UtterancePlayed("a", 20.0, 20.0)
    stream.barge_in()
    # Twilio returns the marks the clear emptied from its buffer: b's, not c's (never sent)
    assert stream.received(echo("b")) == UtteranceCleared("b", 60.0)
    assert code(stream.received(echo("c"))) == "unknown_mark"
    assert stream.played_ms == 20.0
    assert stream.utterance("b") == UtteranceState("b", 60.0, True, False, True)
    assert stream.utterance("c") == UtteranceState("c", 120.0, True, False, True)
    assert stream.utterance("a") == UtteranceState("a", 20.0, True, True, False)


def test_utterances_one_at_a_time_each_with_its_own_id() -> None:
    stream = TwilioStream(SID)
    stream.audio("a", b"\x10" * 10)
    with pytest.raises(ValueError, match="'a' is still open"):
        stream.audio("b", b"\x20")
    with pytest.raises(ValueError, match="'a' is still open"):
        stream.utterance_end("b")
    stream.utterance_end("a")
    with pytest.raises(ValueError, match="'a' has ended"):
        stream.audio("a", b"\x10")
    with pytest.raises(ValueError, match="'a' has ended"):
        stream.utterance_end("a")
    with pytest.raises(ValueError, match="stream_sid"):
        TwilioStream("")


# --- messages from Twilio -----------------------------------------------------------------------

# as Twilio's documentation shows them (the SIDs made up)
CONNECTED = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
START = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": "AC0123456789abcdef0123456789abcdef",
        "streamSid": SID,
        "callSid": "CA0123456789abcdef0123456789abcdef",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"FirstName": "Jane"},
    },
    "streamSid": SID,
}
MEDIA = {
    "event": "media",
    "sequenceNumber": "3",
    "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": "AH//"},
    "streamSid": SID,
}
DTMF = {
    "event": "dtmf",
    "streamSid": SID,
    "sequenceNumber": "5",
    "dtmf": {"track": "inbound_track", "digit": "1"},
}
STOP = {
    "event": "stop",
    "sequenceNumber": "5",
    "stop": {
        "accountSid": "AC0123456789abcdef0123456789abcdef",
        "callSid": "CA0123456789abcdef0123456789abcdef",
    },
    "streamSid": SID,
}


def test_twilios_messages_are_parsed() -> None:
    text = {k: orjson.dumps(v).decode() for k, v in [("c", CONNECTED), ("s", START)]}
    assert parse_twilio_message(text["c"]) == Connected("Call", "1.0.0")
    assert parse_twilio_message(text["s"]) == Start(SID, "CA0123456789abcdef0123456789abcdef")
    assert parse_twilio_message(orjson.dumps(MEDIA)) == Media(SID, b"\x00\x7f\xff", "inbound")
    assert parse_twilio_message(DTMF) == Dtmf(SID, "1")  # an object already decoded
    assert parse_twilio_message(STOP) == Stop(SID)
    assert parse_twilio_message(echo("u1", seq="12")) == Mark(SID, "u1", 12)
    # what we send Twilio reads back too
    assert parse_twilio_message(media_message(SID, b"\x01\x02")) == Media(SID, b"\x01\x02", None)
    assert parse_twilio_message(mark_message(SID, "x")) == Mark(SID, "x", None)


def test_the_stream_accepts_twilios_other_messages_and_changes_nothing() -> None:
    stream = TwilioStream(SID)
    for msg in (CONNECTED, START, MEDIA, DTMF, STOP):
        result = stream.received(orjson.dumps(msg).decode())
        assert not isinstance(result, Invalid), result
    assert isinstance(stream.received(STOP), Stop)
    assert code(stream.received({**STOP, "streamSid": OTHER_SID})) == "foreign_stream"
    assert stream.played_ms == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("not json", "invalid_json"),
        ("[1, 2]", "not_an_object"),
        ('{"event": "clear", "streamSid": "MZ1"}', "unknown_event"),  # ours to send, not theirs
        ('{"type": "speak"}', "unknown_event"),
        ('{"event": "mark", "streamSid": "MZ1", "mark": {}}', "invalid_field"),
        ('{"event": "mark", "streamSid": "MZ1", "mark": "u1"}', "invalid_field"),
        ('{"event": "mark", "mark": {"name": "u1"}}', "invalid_field"),
        (
            '{"event": "mark", "streamSid": "MZ1", "sequenceNumber": "x", "mark": {"name": "u"}}',
            "invalid_field",
        ),
        ('{"event": "media", "streamSid": "MZ1", "media": {"payload": "!!"}}', "invalid_field"),
        ('{"event": "media", "streamSid": "MZ1"}', "invalid_field"),
        ('{"event": "stop", "streamSid": ""}', "invalid_field"),
    ],
)
def test_anything_else_is_refused_with_a_clear_message(text: str, expected: str) -> None:
    result = parse_twilio_message(text)
    assert code(result) == expected
    assert isinstance(result, Invalid)
    assert result.error.message
    assert code(TwilioStream("MZ1").received(text)) == expected


def test_an_unknown_event_names_the_ones_accepted() -> None:
    result = parse_twilio_message('{"event": "clear", "streamSid": "MZ1"}')
    assert isinstance(result, Invalid)
    assert result.error.message == (
        "unknown Twilio event 'clear'; expected one of connected, start, media, dtmf, stop, mark"
    )


# --- pipecat's Twilio serializer reads what we send, and writes what we read --------------------


def mulaw_reference(codes: bytes) -> np.ndarray:
    """G.711 mu-law decoding from its definition (bits inverted: sign, 3-bit exponent, 4-bit
    mantissa; magnitude ((mantissa << 3) + 0x84) << exponent, less the bias 0x84), as 16-bit
    samples."""
    u = ~np.frombuffer(codes, np.uint8).astype(np.int32) & 0xFF
    exponent, mantissa = (u >> 4) & 0x07, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    return np.where(u & 0x80, -magnitude, magnitude).astype("<i2")


def test_the_reference_decoder_agrees_with_ffmpegs() -> None:
    codes = bytes(range(256))
    with av.open(io.BytesIO(codes), "r", format="mulaw", options={"sample_rate": "8000"}) as c:
        ffmpeg = np.concatenate([f.to_ndarray().ravel() for f in c.decode(audio=0)])
    assert np.array_equal(ffmpeg, mulaw_reference(codes))
    assert mulaw_reference(b"\xff\x00\x80").tolist() == [0, -32124, 32124]


async def pipecat_serializer() -> TwilioFrameSerializer:
    """The serializer as a pipecat bot runs it at 8 kHz; no hang-up, so no credentials."""
    params = TwilioFrameSerializer.InputParams(auto_hang_up=False)
    serializer = TwilioFrameSerializer(SID, params=params)
    setup = FrameProcessorSetup(
        clock=SystemClock(),  # type: ignore[no-untyped-call]
        task_manager=TaskManager(),
        pipeline_worker=PipelineWorker(Pipeline([])),
        audio_in_sample_rate=8000,
    )
    await serializer.setup(setup)
    return serializer


def voice_as_ulaw() -> list[bytes]:
    """Half a second of a 440 Hz tone through our `ulaw_8000` encoder: pieces of any length."""
    t = np.arange(12_000) / 24_000
    pcm = (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()
    encoder = create_encoder(FORMATS["ulaw_8000"])
    pieces: list[bytes] = []
    for i in range(0, len(pcm), 4_801):
        pieces += encoder.push(pcm[i : i + 4_801])
    return pieces + encoder.flush()


async def test_pipecat_decodes_our_media_to_our_samples() -> None:
    serializer = await pipecat_serializer()
    pieces = voice_as_ulaw()
    ulaw = b"".join(pieces)
    assert len(ulaw) == 4_000  # 25 frames
    stream = TwilioStream(SID, lead_s=1.0)  # all 25 (with the mark) in one go
    for piece in pieces:
        stream.audio("u1", piece)
    stream.utterance_end("u1")
    sent = stream.send_now(0.0)
    assert len(sent) == 26
    decoded = b""
    for text in sent[:-1]:
        frame = await serializer.deserialize(text)  # as Twilio would send it: our payload
        assert isinstance(frame, InputAudioRawFrame)
        assert (frame.sample_rate, frame.num_channels) == (8000, 1)
        assert len(frame.audio) == 320  # 160 samples of 16 bits
        decoded += frame.audio
    assert decoded == mulaw_reference(ulaw).tobytes()
    assert np.abs(np.frombuffer(decoded, "<i2")).max() > 7_000  # the tone, not silence
    assert await serializer.deserialize(sent[-1]) is None  # pipecat does nothing with marks


async def test_padding_decodes_to_silence_in_pipecat() -> None:
    serializer = await pipecat_serializer()
    stream = TwilioStream(SID)
    stream.audio("u1", b"\x80" * 10)  # the loudest positive code
    stream.utterance_end("u1")
    frame = await serializer.deserialize(stream.send_now(0.0)[0])
    assert isinstance(frame, InputAudioRawFrame)
    samples = np.frombuffer(frame.audio, "<i2")
    assert samples.tolist() == [32124] * 10 + [0] * 150


async def test_pipecats_media_and_clear_are_what_we_read_and_write() -> None:
    serializer = await pipecat_serializer()
    # every code but 0x7F (mu-law's other zero, re-encoded as 0xFF), decoded to its level
    codes = bytes(c for c in range(256) if c != 0x7F)
    pcm = mulaw_reference(codes).tobytes()
    text = await serializer.serialize(OutputAudioRawFrame(pcm, sample_rate=8000, num_channels=1))
    assert isinstance(text, str)
    assert parse_twilio_message(text) == Media(SID, codes, None)
    assert isinstance(TwilioStream(SID).received(text), Media)
    assert loads(text) == loads(media_message(SID, codes))
    clear = await serializer.serialize(InterruptionFrame())
    assert isinstance(clear, str)
    assert loads(clear) == loads(clear_message(SID))
