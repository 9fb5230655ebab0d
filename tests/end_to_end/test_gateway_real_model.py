"""The gateway in front of the real model server (real Kokoro), over loopback, real clients."""

from __future__ import annotations

import base64
import random
import re

import httpx
import numpy as np
import orjson
import pytest
from openai import AsyncOpenAI
from websockets.asyncio.client import connect

from gateway.sources.sse import SSEDecoder, SSEEvent
from tests.support.codec_checks import mp4_boxes, split_mp3_frames
from tests.support.gateway_client import (
    counted,
    decode_seconds,
    metric,
    split_audio_frame,
    sse_get,
    sse_post,
    wait_for_metric,
)
from tests.support.servers import RunningServer

pytestmark = pytest.mark.real_model

THREE = "Hello there. This is a post deployment check. It has three sentences."


async def test_sse_three_sentences_in_mp3(gateway_server: RunningServer) -> None:
    reply = await sse_get(gateway_server.http_url, {"text": THREE, "format": "mp3"})
    names = reply.names
    assert names[:2] == ["agent_start", "audio_stream_start"]
    assert names[-2:] == ["audio_stream_end", "agent_end"]
    assert "error" not in names
    first_audio = names.index("audio_chunk")
    assert names.index("text_delta") < first_audio
    assert set(names[first_audio:-2]) == {"audio_chunk"}
    assert reply.one("agent_start")["mode"] == "bidi"
    start = reply.one("audio_stream_start")
    assert (start["format"], start["mime"], start["sample_rate"]) == ("mp3", "audio/mpeg", 24_000)
    assert "".join(d["text"] for d in reply.data("text_delta")) == THREE
    chunks = reply.audio_chunks()
    assert [d["seq"] for d in reply.data("audio_chunk")] == list(range(len(chunks)))
    for chunk in chunks:
        split_mp3_frames(chunk)  # raises unless every event is whole MP3 frames
    stream = b"".join(chunks)
    end = reply.one("audio_stream_end")
    assert end["total_chunks"] == len(chunks)
    assert decode_seconds(stream, "mp3") == pytest.approx(end["duration_s"], abs=0.1)
    assert 3.0 < end["duration_s"] < 8.0
    metrics = reply.one("agent_end")["metrics"]
    assert metrics["audio_bytes"] == len(stream)
    assert metrics["text_chars"] == len(THREE)
    assert 0 < metrics["first_text_ms"] <= metrics["ttfa_ms"]
    # "Hello there." first; the rest grouped as the listener's buffer allows
    assert 2 <= metrics["chunks"] <= 3
    assert len(metrics["chunk_times_ms"]) == metrics["chunks"]
    # the chunks as cut: the whole text, a space between each and the next
    assert len(metrics["chunk_chars"]) == metrics["chunks"]
    assert sum(metrics["chunk_chars"]) + metrics["chunks"] - 1 == len(THREE)
    assert metrics["chunk_chars"][0] == len("Hello there.")
    # each chunk's audio, in order, adds up to the whole reply
    assert len(metrics["chunk_audio_s"]) == metrics["chunks"]
    assert sum(metrics["chunk_audio_s"]) == pytest.approx(end["duration_s"], abs=0.005)
    ids = [e.id for e in reply.events]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("fmt", ["aac", "opus"])
async def test_sse_containers_carry_whole_units(gateway_server: RunningServer, fmt: str) -> None:
    reply = await sse_post(gateway_server.http_url, {"text": THREE, "format": fmt})
    chunks = reply.audio_chunks()
    if fmt == "aac":
        assert mp4_boxes(chunks[0])[:2] == [b"ftyp", b"moov"]
        for chunk in chunks[1:]:
            boxes = mp4_boxes(chunk)  # raises on a cut box
            assert boxes
            assert set(boxes) == {b"moof", b"mdat"}
    else:
        assert chunks[0].startswith(bytes.fromhex("1a45dfa3"))
        for chunk in chunks[1:]:
            assert chunk.startswith(bytes.fromhex("1f43b675"))
    seconds = decode_seconds(b"".join(chunks), fmt)
    assert seconds == pytest.approx(reply.one("audio_stream_end")["duration_s"], abs=0.15)


def whole_body_events(raw: bytes) -> list[SSEEvent]:
    """The events of a whole SSE body, read the plain way, independently of `SSEDecoder`: all
    of it at once, split into lines on any of the spec's line ends, fields gathered until each
    blank line."""
    events = []
    fields: dict[str, list[str]] = {}
    for line in re.split(r"\r\n|\r|\n", raw.decode("utf-8")):
        if not line:  # the end of an event: dispatched when it has data
            if "data" in fields:
                retry = fields.get("retry", [""])[-1]
                events.append(
                    SSEEvent(
                        fields.get("event", ["message"])[-1],
                        "\n".join(fields["data"]),
                        fields.get("id", [None])[-1],
                        int(retry) if retry.isdigit() else None,
                    )
                )
            fields = {}
        elif not line.startswith(":"):
            name, _, value = line.partition(":")
            fields.setdefault(name, []).append(value.removeprefix(" "))
    return events


async def test_sse_reader_gives_the_same_events_however_bytes_arrive(
    gateway_server: RunningServer,
) -> None:
    reply = await sse_get(gateway_server.http_url, {"text": "Hello there.", "format": "mp3"})
    raw = reply.raw
    expected = whole_body_events(raw)
    # the body parsed whole is the reply the gateway meant to send: its events in order, ids
    # counting up, and MP3 audio that adds up to what agent_end reports
    names = [e.event for e in expected]
    audio_at = names.index("audio_chunk")
    assert names[:audio_at] == ["agent_start", "audio_stream_start", "text_delta"]
    assert set(names[audio_at:-2]) == {"audio_chunk"}
    assert names[-2:] == ["audio_stream_end", "agent_end"]
    uid = orjson.loads(expected[0].data)["utterance_id"]
    assert [e.id for e in expected] == [f"{uid}:{n}" for n in range(len(expected))]
    data = [orjson.loads(e.data) for e in expected]
    assert data[2]["text"] == "Hello there."
    audio = b"".join(base64.b64decode(d["data"]) for d in data[audio_at:-2])
    split_mp3_frames(audio)
    assert len(audio) == data[-1]["metrics"]["audio_bytes"] > 0
    # and the streaming decoder gives exactly those events however the bytes are cut: as they
    # came off the socket, one byte at a time, and at 30 random points, 20 times
    assert reply.events == expected
    rng = random.Random(7)
    splits = [[raw[i : i + 1] for i in range(len(raw))]]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(raw)), 30))
        splits.append([raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True)])
    for pieces in splits:
        decoder = SSEDecoder()
        events = [e for piece in pieces for e in decoder.push(piece)]
        assert events == expected


def voiced_s(pcm: bytes) -> float:
    """Seconds of 20 ms frames louder than 1 % of the loudest: the speech, without the pauses
    between sentences (Kokoro's own inside a chunk, trimmed to 30 ms at a chunk's edges)."""
    samples = np.frombuffer(pcm, np.int16).astype(np.float64)
    frames = samples[: samples.size // 480 * 480].reshape(-1, 480)
    rms = np.sqrt((frames**2).mean(axis=1))
    return float((rms > 0.01 * rms.max()).sum() * 0.02)


async def test_bidi_and_batch_give_the_same_audio_duration(gateway_server: RunningServer) -> None:
    """The same speech either way; the pauses between sentences differ with where the chunks
    fall (a sentence end inside a bidi chunk keeps Kokoro's pause, as one call does). The
    default model server streams its decoder: a segment's samples do not follow the speed the
    server has learned (on the windows decoder its windows, and so its level and what counts as
    voiced here, do: bidi 3.42 s voiced against batch 3.6 in a fresh-clone run after the rest of
    the suite, 5 % apart, the bound below)."""
    durations = {}
    voiced = {}
    for mode in ("bidi", "batch"):
        reply = await sse_get(
            gateway_server.http_url, {"text": THREE, "format": "pcm", "mode": mode}
        )
        assert reply.one("agent_start")["mode"] == mode
        pcm = b"".join(reply.audio_chunks())
        durations[mode] = len(pcm) / 48_000
        voiced[mode] = voiced_s(pcm)
        assert reply.one("audio_stream_end")["duration_s"] == pytest.approx(durations[mode], 1e-3)
    assert voiced["bidi"] == pytest.approx(voiced["batch"], rel=0.05)
    assert durations["batch"] * 0.95 < durations["bidi"] < durations["batch"] * 1.25


async def test_websocket_two_utterances_and_client_streamed_text(
    gateway_server: RunningServer,
) -> None:
    async with connect(gateway_server.ws_url + "/v1/speak/ws") as ws:
        for uid, text in (("u1", "Hello there."), ("u2", "It has three sentences.")):
            await ws.send(
                orjson.dumps(
                    {"type": "speak", "text": text, "format": "mp3", "utterance_id": uid}
                ).decode()
            )
            audio = b""
            events = []
            while True:
                frame = await ws.recv()
                if isinstance(frame, bytes):
                    owner, units = split_audio_frame(frame)
                    assert owner == uid
                    split_mp3_frames(units)
                    audio += units
                    continue
                event = orjson.loads(frame)
                assert event.get("utterance_id") == uid, event
                events.append(event["type"])
                if event["type"] == "agent_end":
                    break
            assert events[0] == "agent_start"
            assert "audio_chunk" not in events
            assert 0.5 < decode_seconds(audio, "mp3") < 4.0

        # the client streams its own LLM's text, then flushes
        await ws.send('{"type": "speak", "format": "pcm", "utterance_id": "own"}')
        for delta in ["This is my ", "own text, streamed ", "in pieces. Done."]:
            await ws.send(orjson.dumps({"type": "text", "delta": delta}).decode())
        await ws.send('{"type": "flush"}')
        pcm = b""
        texts = []
        while True:
            frame = await ws.recv()
            if isinstance(frame, bytes):
                pcm += split_audio_frame(frame)[1]
                continue
            event = orjson.loads(frame)
            if event["type"] == "text_delta":
                texts.append(event["text"])
            if event["type"] == "agent_end":
                break
        assert "".join(texts) == "This is my own text, streamed in pieces. Done."
        assert len(pcm) > 48_000
        assert event["metrics"]["chunks"] >= 2  # the first clause released early


async def test_openai_sdk_speech(gateway_server: RunningServer) -> None:
    client = AsyncOpenAI(base_url=gateway_server.http_url + "/v1", api_key="not-needed")
    async with client.audio.speech.with_streaming_response.create(
        model="kokoro", voice="alloy", input="Hello there.", response_format="mp3"
    ) as response:
        assert response.headers["content-type"] == "audio/mpeg"
        audio = await response.read()
    split_mp3_frames(audio)
    assert 0.5 < decode_seconds(audio, "mp3") < 3.0
    for fmt in ("opus", "aac", "flac", "wav"):
        whole = await client.audio.speech.create(
            model="kokoro", voice="jf_alpha", input="Hello there.", response_format=fmt
        )
        assert 0.5 < decode_seconds(whole.content, fmt) < 3.0, fmt
    pcm = await client.audio.speech.create(
        model="kokoro", voice="alloy", input="Hello there.", response_format="pcm"
    )
    assert 24_000 < len(pcm.content) < 3 * 48_000
    await client.close()


async def test_openai_speech_sse_stream_format(gateway_server: RunningServer) -> None:
    body = {
        "model": "kokoro",
        "input": "Hello there.",
        "voice": "alloy",
        "response_format": "mp3",
        "stream_format": "sse",
    }
    async with (
        httpx.AsyncClient(base_url=gateway_server.http_url, timeout=60) as http,
        http.stream("POST", "/v1/audio/speech", json=body) as r,
    ):
        decoder = SSEDecoder()
        events = [e for chunk in [c async for c in r.aiter_raw()] for e in decoder.push(chunk)]
    kinds = [orjson.loads(e.data)["type"] for e in events]
    assert kinds[-1] == "speech.audio.done"
    assert set(kinds[:-1]) == {"speech.audio.delta"}
    import base64

    audio = b"".join(base64.b64decode(orjson.loads(e.data)["audio"]) for e in events[:-1])
    assert 0.5 < decode_seconds(audio, "mp3") < 3.0


async def test_metrics_and_health(gateway_server: RunningServer) -> None:
    opus = {"format": "opus", "mode": "bidi"}
    replies = await counted(gateway_server, "gateway_replies_total", **opus)
    ttfa_count = await counted(gateway_server, "gateway_time_to_first_audio_seconds_count", **opus)
    ttfa_sum = await counted(gateway_server, "gateway_time_to_first_audio_seconds_sum", **opus)
    reply = await sse_get(gateway_server.http_url, {"text": "Hello there.", "format": "opus"})
    async with httpx.AsyncClient(base_url=gateway_server.http_url) as http:
        assert (await http.get("/healthz")).json() == {"status": "ok"}
        ready = await http.get("/readyz")
        assert (ready.status_code, ready.json()) == (200, {"status": "ready"})
        assert (await http.get("/metrics")).status_code == 404  # the internal listener only
    # once it has ended (the gauge back to 0, its figures recorded in the same step): this
    # reply, counted once, with its first audio's time as it reported it
    assert await wait_for_metric(gateway_server, "gateway_active_sessions", 0, transport="sse") == 0
    assert await metric(gateway_server, "gateway_replies_total", **opus) - replies == 1
    count = await metric(gateway_server, "gateway_time_to_first_audio_seconds_count", **opus)
    assert count - ttfa_count == 1
    seconds = await metric(gateway_server, "gateway_time_to_first_audio_seconds_sum", **opus)
    ttfa_s = reply.one("agent_end")["metrics"]["ttfa_ms"] / 1000
    assert seconds - ttfa_sum == pytest.approx(ttfa_s, abs=0.002)
