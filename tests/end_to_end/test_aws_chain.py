"""The whole AWS chain offline, real SDK clients, real onnx engine:

client -> gateway -> Bedrock emulator (aioboto3 ConverseStream) -> chunker
       -> SageMaker bidi emulator (HTTP/2 SDK through its transport seam) -> model server, or
       -> SageMaker response-stream emulator (aioboto3) -> model server's POST /invocations
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import orjson
import pytest
from websockets.asyncio.client import connect

from emulators.bedrock import BedrockScript, create_bedrock_emulator
from emulators.sagemaker_bidi import BidiScript, SeamTransport
from emulators.sagemaker_stream import StreamScript, create_sagemaker_stream_emulator
from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from tests.support.codec_checks import split_mp3_frames
from tests.support.gateway_client import decode_seconds, sse_get, ws_reply_audio
from tests.support.servers import RunningServer, serve

pytestmark = pytest.mark.real_model

ANSWER = "Hello there. This is a post deployment check. It has three sentences."
NEXT = "Hello again. It works."  # the answer after an error (`next_works`)


@dataclass
class Chain:
    gateway: RunningServer
    bedrock: BedrockScript
    bidi: BidiScript
    stream: StreamScript


@pytest.fixture
def chain(model_server: RunningServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Chain]:
    bedrock, stream = BedrockScript(answer=ANSWER), StreamScript()
    seam = SeamTransport(model_server.ws_url + "/invocations-bidirectional-stream", BidiScript())
    with (
        serve(create_bedrock_emulator(bedrock)) as bedrock_server,
        serve(create_sagemaker_stream_emulator(model_server.http_url, stream)) as stream_server,
    ):
        for name, value in {
            "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL_BEDROCK_RUNTIME": bedrock_server.http_url,
            "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": stream_server.http_url,
        }.items():
            monkeypatch.setenv(name, value)
        settings = GatewaySettings(
            llm="bedrock",
            tts_transport="sagemaker",
            sagemaker_endpoint="kokoro-tts",
            aws_region="us-east-1",
            model_server_url="http://127.0.0.1:9",  # unused here
        )
        with serve(create_gateway(settings, sagemaker_http2_transport=seam)) as gateway:
            yield Chain(gateway, bedrock, seam.script, stream)


async def test_bidi_over_sse(chain: Chain) -> None:
    reply = await sse_get(chain.gateway.http_url, {"prompt": "Check?", "format": "mp3"})
    assert "error" not in reply.names
    assert "".join(d["text"] for d in reply.data("text_delta")) == ANSWER
    chunks = reply.audio_chunks()
    for chunk in chunks:
        split_mp3_frames(chunk)
    seconds = decode_seconds(b"".join(chunks), "mp3")
    assert 3.0 < seconds < 8.0
    assert chain.bidi.streams == 1  # one bidirectional stream carried every chunk
    kinds = [kind for kind, _ in chain.bidi.container_messages]
    assert kinds == ["binary"] * len(kinds)  # as SageMaker delivers them
    messages = [orjson.loads(m) for _, m in chain.bidi.container_messages]
    assert messages[-1] == {"type": "close"}  # the chunks, then the close
    texts: list[str] = [m["text"] for m in messages[:-1]]
    # the first sentence at once; how the rest is grouped follows the listener's buffer
    assert texts[0] == "Hello there."
    assert " ".join(texts) == ANSWER
    # every chunk carries its deadline over the stream: the first's is its first audio's time
    # ahead; a later one's is when the audio before it runs out, 0 when that is already past
    # (a slow machine: the plan says 'now', never a time gone by)
    assert messages[0]["deadline_ms"] > 0
    assert all(m["deadline_ms"] >= 0 for m in messages[:-1])
    assert chain.stream.requests == []


async def test_batch_over_sse_and_same_duration_as_bidi(chain: Chain) -> None:
    durations = {}
    for mode in ("batch", "bidi"):
        reply = await sse_get(
            chain.gateway.http_url, {"prompt": "Check?", "format": "pcm", "mode": mode}
        )
        assert "error" not in reply.names
        durations[mode] = len(b"".join(reply.audio_chunks())) / 48_000
    assert len(chain.stream.requests) == 1
    assert orjson.loads(chain.stream.requests[0])["text"] == ANSWER
    assert durations["bidi"] == pytest.approx(durations["batch"], rel=0.05)


async def test_bidi_over_websocket(chain: Chain) -> None:
    async with connect(chain.gateway.ws_url + "/v1/speak/ws") as ws:
        await ws.send(
            '{"type": "speak", "prompt": "Check?", "format": "opus", "utterance_id": "w"}'
        )
        audio, _ = await ws_reply_audio(ws)
    assert 3.0 < decode_seconds(audio, "opus") < 8.0


async def test_llm_error_mid_answer(chain: Chain) -> None:
    url = chain.gateway.http_url
    chain.bedrock.stream_error_after = 2  # the LLM fails mid-answer
    reply = await sse_get(url, {"prompt": "Check?", "format": "pcm"})
    assert reply.names[-2:] == ["error", "agent_end"]
    assert reply.one("error")["code"] == "llm_error"
    chain.bedrock.stream_error_after = None
    await next_works(chain)


async def test_endpoint_error_mid_audio(chain: Chain) -> None:
    url = chain.gateway.http_url
    chain.stream.model_error_after = 10_000  # the endpoint fails mid-audio (batch)
    reply = await sse_get(url, {"prompt": "Check?", "format": "pcm", "mode": "batch"})
    assert reply.one("error")["code"] == "tts_ModelStreamError"
    chain.stream.model_error_after = None
    await next_works(chain)


async def test_container_error_through_the_bidi_stream(chain: Chain) -> None:
    url = chain.gateway.http_url
    reply = await sse_get(url, {"prompt": "Check?", "format": "pcm", "voice": "nobody"})
    assert reply.one("error")["code"] == "tts_unknown_voice"
    await next_works(chain)


async def next_works(chain: Chain) -> None:
    """The next reply after an error, bidi and batch, has none. What is checked is that the
    chain still works, not how much it voices: a short answer, still two chunks over the
    bidirectional stream (the full one voiced twice more took most of each test)."""
    chain.bedrock.answer = NEXT
    for mode in ("bidi", "batch"):
        ok = await sse_get(
            chain.gateway.http_url, {"prompt": "Check?", "format": "pcm", "mode": mode}
        )
        assert "error" not in ok.names
