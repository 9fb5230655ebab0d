"""The telephone's and pipelines' formats on every route: G.711 at 8 kHz (`ulaw_8000`,
`alaw_8000`) and `pcm`/`wav` at a `sample_rate`, through the real gateway over the fake model
server (SSE, the WebSocket, and OpenAI's speech route with the openai SDK)."""

from __future__ import annotations

import warnings

import httpx
import numpy as np
import openai
import orjson
import pytest
from websockets.asyncio.client import connect

from tests.support.fakes import expected_pcm_bytes
from tests.support.gateway_client import sse_get, ws_events
from tests.support.servers import RunningServer

with warnings.catch_warnings():  # in 3.12's library, deprecated: the reference G.711 here
    warnings.simplefilter("ignore", DeprecationWarning)
    import audioop

TEXT = "Your order shipped yesterday."


def samples(pcm: bytes) -> int:
    return len(pcm) // 2


async def test_sse_speaks_g711_and_pcm_at_the_rate_asked(gateway_on_fake: RunningServer) -> None:
    """The same text as 24 kHz pcm, as pcm at 8 kHz, and as mu-law and A-law: the 8 kHz forms
    a third of the samples (one resampler over the whole reply), the G.711 ones a byte for
    each of those samples, coded from the same 8 kHz audio; each stream's start says its
    rate and type."""
    url = gateway_on_fake.http_url
    full = await sse_get(url, {"text": TEXT, "format": "pcm"})
    narrow = await sse_get(url, {"text": TEXT, "format": "pcm", "sample_rate": "8000"})
    ulaw = await sse_get(url, {"text": TEXT, "format": "ulaw_8000"})
    alaw = await sse_get(url, {"text": TEXT, "format": "alaw_8000"})
    assert full.one("audio_stream_start")["sample_rate"] == 24_000
    assert narrow.one("audio_stream_start") | {"voice": ""} == {
        "format": "pcm",
        "mime": "audio/pcm;rate=8000;channels=1;encoding=s16le",
        "voice": "",
        "sample_rate": 8_000,
    }
    assert (ulaw.one("audio_stream_start")["mime"], alaw.one("audio_stream_start")["mime"]) == (
        "audio/basic",
        "audio/x-alaw-basic",
    )
    pcm24 = b"".join(full.audio_chunks())
    pcm8 = b"".join(narrow.audio_chunks())
    assert len(pcm24) == expected_pcm_bytes(TEXT)
    assert abs(samples(pcm8) - samples(pcm24) / 3) <= 2
    for reply, codec in ((ulaw, "ulaw"), (alaw, "alaw")):
        coded = b"".join(reply.audio_chunks())
        assert len(coded) == samples(pcm8)  # a byte a sample: 8000 bytes a second
        # the same duration said at the end, from the model's own audio
        assert reply.one("audio_stream_end")["duration_s"] == pytest.approx(len(pcm24) / 48_000)
        # decoded by a reference G.711 decoder: the 8 kHz audio within G.711's quantization (a
        # sixteenth of the level, or its smallest step; the encoder tests check the codes)
        back = np.frombuffer(getattr(audioop, f"{codec}2lin")(coded, 2), "<i2").astype(np.int64)
        original = np.frombuffer(pcm8, "<i2").astype(np.int64)
        assert np.all(np.abs(back - original) <= np.abs(original) // 16 + 16)


async def test_the_websocket_speaks_pcm_at_a_pipelines_rate(gateway_on_fake: RunningServer) -> None:
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        speak = {"type": "speak", "text": TEXT, "format": "pcm", "sample_rate": 16_000}
        await ws.send(orjson.dumps(speak).decode())
        audio, events = await ws_events(ws)
        start = next(e for e in events if e["type"] == "audio_stream_start")
        assert start["sample_rate"] == 16_000
        assert abs(samples(audio) - samples(b"\0" * expected_pcm_bytes(TEXT)) * 2 / 3) <= 2
        # a rate the format does not take: refused, the session stays usable
        await ws.send(orjson.dumps(speak | {"format": "mp3"}).decode())
        error = orjson.loads(await ws.recv())
        assert (error["type"], error["code"]) == ("error", "invalid_field")
        assert "sample_rate 16000 is not offered for mp3; use 24000" in error["message"]
        await ws.send(orjson.dumps(speak | {"format": "ulaw_8000", "sample_rate": None}).decode())
        audio, _ = await ws_events(ws)
        assert len(audio) == samples(b"\0" * expected_pcm_bytes(TEXT)) // 3


async def test_openai_speech_takes_g711_and_a_sample_rate(gateway_on_fake: RunningServer) -> None:
    client = openai.AsyncOpenAI(base_url=gateway_on_fake.http_url + "/v1", api_key="unused")
    try:
        async with client.audio.speech.with_streaming_response.create(
            model="kokoro",
            voice="af_test",
            input=TEXT,
            response_format="ulaw_8000",  # type: ignore[arg-type]
        ) as response:
            assert response.headers["content-type"] == "audio/basic"
            ulaw = await response.read()
        wav = await client.audio.speech.create(
            model="kokoro",
            voice="af_test",
            input=TEXT,
            response_format="wav",
            extra_body={"sample_rate": 16_000},
        )
    finally:
        await client.close()
    pcm24_samples = expected_pcm_bytes(TEXT) // 2
    assert abs(len(ulaw) - pcm24_samples / 3) <= 2
    body = wav.content
    assert int.from_bytes(body[24:28], "little") == 16_000
    assert abs((len(body) - 44) // 2 - pcm24_samples * 2 / 3) <= 2
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        bad = await http.post(
            "/v1/audio/speech",
            json={"input": TEXT, "response_format": "mp3", "sample_rate": 8_000},
        )
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_field"
    assert "sample_rate 8000 is not offered for mp3" in bad.json()["error"]["message"]
