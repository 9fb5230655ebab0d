"""Markup through every gateway route to the model server (issue #51), over the fake engine
and the identity G2P (so the engine's calls are the phonemes it was given): the constructs are
voiced, never read, however the text arrives (given whole or paced token by token, so a tag or
a bracket comes split), an SSML reply's chunks are each a document, a pause is its samples of
silence, and bad markup is refused before any audio. The real weights:
tests/model_server/test_markup_real.py."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from model_server.audio import TrimPolicy
from tests.support.fakes import FakeEngine, expected_pcm_bytes, frame_samples
from tests.support.gateway_client import sse_get, sse_post, ws_reply_audio
from tests.support.servers import RunningServer

RATE = 24_000
SILENCE = 2 * (RATE - round((TrimPolicy().lead_s + TrimPolicy().tail_s) * RATE))  # 1 s, bytes
TAIL = int(TrimPolicy().tail_s * RATE)
INLINE = "Hello there, my friend. [pause:1s] Say [Kokoro](/kˈOkəɹO/) now."
SSML = (
    '<speak>Hello there, my friend. <break time="1s"/> '
    '<prosody rate="50%">Say <sub alias="sequel">SQL</sub> now.</prosody></speak>'
)
# what the engine voices, and the bytes it makes with the silence between
EXPECTED = {
    INLINE: (
        ["Hello there, my friend.", "Say kˈOkəɹO now."],
        expected_pcm_bytes("Hello there, my friend.")
        + SILENCE
        + expected_pcm_bytes("Say kˈOkəɹO now."),
    ),
    SSML: (
        ["Hello there, my friend.", "Say sequel now."],
        expected_pcm_bytes("Hello there, my friend.")
        + SILENCE
        + 2 * (len("Say sequel now.") * frame_samples(0.5) + TAIL),
    ),
}


async def _sse_get(gateway: RunningServer, text: str, **params: Any) -> bytes:
    reply = await sse_get(gateway.http_url, {"text": text, "format": "pcm", **params})
    assert reply.names[-1] == "agent_end", reply.names
    return b"".join(reply.audio_chunks())


async def _sse_post(gateway: RunningServer, text: str, **params: Any) -> bytes:
    reply = await sse_post(gateway.http_url, {"text": text, "format": "pcm", **params})
    assert reply.names[-1] == "agent_end", reply.names
    return b"".join(reply.audio_chunks())


async def _websocket(gateway: RunningServer, text: str, **params: Any) -> bytes:
    async with connect(gateway.ws_url + "/v1/speak/ws") as ws:
        speak = {"type": "speak", "text": text, "format": "pcm", **params}
        await ws.send(orjson.dumps(speak).decode())
        audio, end = await ws_reply_audio(ws)
    assert len(audio) == end["metrics"]["audio_bytes"]
    return audio


async def _openai(gateway: RunningServer, text: str, **params: Any) -> bytes:
    body = {"model": "kokoro", "input": text, "response_format": "pcm", "voice": "", **params}
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http:
        response = await http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    return response.content


ROUTES = {"sse-get": _sse_get, "sse-post": _sse_post, "websocket": _websocket, "openai": _openai}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("text", [INLINE, SSML], ids=["inline", "ssml"])
async def test_markup_is_voiced_never_read_on_every_route(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine, route: str, text: str
) -> None:
    pcm = await ROUTES[route](gateway_on_fake, text)
    calls, size = EXPECTED[text]
    assert fake_engine.calls == calls
    assert len(pcm) == size


@pytest.mark.parametrize("text", [INLINE, SSML], ids=["inline", "ssml"])
async def test_markup_split_over_tokens_is_held_whole(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine, text: str
) -> None:
    # the echo source paces the text token by token, as an LLM streams it: tags and brackets
    # arrive in pieces
    pcm = await _sse_get(gateway_on_fake, text, echo_tps=500)
    calls, size = EXPECTED[text]
    assert fake_engine.calls == calls
    assert len(pcm) == size


async def test_markup_none_reads_it_as_text(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    await _sse_post(gateway_on_fake, "Wait [pause:1s] here.", markup="none")
    assert fake_engine.calls == ["Wait [pause:1s] here."]


@pytest.mark.parametrize(
    ("text", "markup", "code"),
    [
        ("<speak>Hello <audio/></speak>", "strict", "invalid_markup"),
        ("Wait [pause:one] here.", "strict", "invalid_markup"),
        ("Wait [pause:11s] here.", "auto", "pause_too_long"),
    ],
)
async def test_bad_markup_is_refused_before_any_audio_on_every_route(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine, text: str, markup: str, code: str
) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, timeout=30) as http:
        answers = [
            await http.get("/v1/speak/sse", params={"text": text, "markup": markup}),
            await http.post("/v1/speak", json={"text": text, "markup": markup}),
            await http.post(
                "/v1/audio/speech", json={"input": text, "markup": markup, "voice": ""}
            ),
            await http.post("/invocations", json={"text": text, "markup": markup}),
        ]
    for answer in answers:
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == code
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        await ws.send(orjson.dumps({"type": "speak", "text": text, "markup": markup}).decode())
        error = orjson.loads(await ws.recv())  # refused: no reply began
        assert error["type"] == "error"
        assert error["code"] == code
        await ws.send(orjson.dumps({"type": "speak", "text": "Fine.", "format": "pcm"}).decode())
        audio, _ = await ws_reply_audio(ws)  # the session goes on
        assert len(audio) == expected_pcm_bytes("Fine.")
    assert fake_engine.calls == ["Fine."]
