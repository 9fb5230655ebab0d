"""Faults on the AWS hops, as the client sees them through the real gateway (issue #13).

The emulators inject what the services send (HTTP errors with `x-amzn-ErrorType` before a
stream, exception messages inside it), before and after the reply's first audio or text; the
gateway runs on loopback with the real SDK clients (aioboto3; the HTTP/2 SDK through its
transport seam) and the fake engine's model server behind the SageMaker emulators. What must
hold (gateway/retry.py): a retryable failure before the first audio (TTS) or text (Bedrock) is
retried and the reply succeeds with no audio twice; after it, nothing is retried and the reply
ends with a retryable `error`, then `agent_end`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import connect

from emulators.bedrock import BedrockScript, create_bedrock_emulator
from emulators.sagemaker_bidi import BidiScript, SeamTransport
from emulators.sagemaker_stream import StreamScript, create_sagemaker_stream_emulator
from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from tests.support.fakes import expected_pcm_bytes
from tests.support.gateway_client import (
    SSEReply,
    counted,
    split_audio_frame,
    sse_get,
    ws_reply_audio,
)
from tests.support.servers import RunningServer, serve

TEXT = "Hello there."  # one chunk, one segment: its PCM length is known exactly
# several chunks, so several audio parts; the first sentence is the first chunk, at once
LONG_TEXT = "Hello there. This is a post deployment check. It has three sentences."
ANSWER = "Sure, here is the answer you asked for. It comes from Bedrock."
TOKENS = ["Sure, ", "here ", "is "]  # the first three tokens of ANSWER
ATTEMPTS = 4  # the gateway's --retry-attempts default
# generous, so that every retry the policy allows happens whatever this machine's speed: the
# tests count attempts, never time
BUDGET_S = 120.0


def _aws_env(mp: pytest.MonkeyPatch, **urls: str) -> None:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_EC2_METADATA_DISABLED": "true",
        **urls,
    }.items():
        mp.setenv(name, value)


def _reset[T](script: T, fresh: Callable[[], T]) -> T:
    """Every field back to `fresh()`'s, in place: the emulators hold the script object."""
    template = fresh()
    for f in dataclasses.fields(template):  # type: ignore[arg-type]
        setattr(script, f.name, getattr(template, f.name))
    return script


def _stream_script() -> StreamScript:
    return StreamScript(max_part=777)  # parts well under the first audio's length


# --- SageMaker: one gateway, both transports ---------------------------------------------------


@dataclass
class SageMaker:
    gateway: RunningServer
    bidi: BidiScript
    stream: StreamScript


@pytest.fixture(scope="module")
def _sagemaker(fake_server: RunningServer) -> Iterator[SageMaker]:
    bidi, stream = BidiScript(), _stream_script()
    seam = SeamTransport(fake_server.ws_url + "/invocations-bidirectional-stream", bidi)
    with (
        serve(create_sagemaker_stream_emulator(fake_server.http_url, stream)) as emulator,
        pytest.MonkeyPatch.context() as mp,
    ):
        _aws_env(mp, AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME=emulator.http_url)
        settings = GatewaySettings(
            tts_transport="sagemaker",
            sagemaker_endpoint="kokoro-tts",
            aws_region="us-east-1",
            model_server_url="http://127.0.0.1:9",  # unused: SageMaker carries the speech
            first_audio_budget_s=BUDGET_S,
        )
        with serve(create_gateway(settings, sagemaker_http2_transport=seam)) as gateway:
            yield SageMaker(gateway, bidi, stream)


@pytest.fixture
def sagemaker(_sagemaker: SageMaker) -> SageMaker:
    _reset(_sagemaker.bidi, BidiScript)
    _reset(_sagemaker.stream, _stream_script)
    return _sagemaker


async def speak(gateway: RunningServer, mode: str, text: str = TEXT) -> SSEReply:
    return await sse_get(gateway.http_url, {"text": text, "format": "pcm", "mode": mode})


def audio_parts(script: BidiScript) -> int:
    """Bytes of audio the bidi emulator sent back."""
    return sum(size for kind, size in script.parts if kind == "BINARY")


def synthesized(script: BidiScript) -> list[str]:
    """The texts the container was asked to speak, every stream's, in order."""
    messages = [orjson.loads(m) for _, m in script.container_messages]
    return [m["text"] for m in messages if "text" in m]


async def tts_retries(gateway: RunningServer) -> float:
    return await counted(gateway, "gateway_retries_total", hop="tts")


def assert_whole_audio(reply: SSEReply) -> None:
    """The reply succeeded and its audio is the text's, once: a retried attempt adds nothing."""
    assert "error" not in reply.names, reply.data("error")
    assert reply.names[0] == "agent_start"
    assert reply.names[-2:] == ["audio_stream_end", "agent_end"]
    pcm = b"".join(reply.audio_chunks())
    metrics = reply.one("agent_end")["metrics"]
    assert len(pcm) == metrics["audio_bytes"] == expected_pcm_bytes(TEXT)
    assert reply.one("audio_stream_end")["duration_s"] == metrics["duration_s"]


def assert_retryable_error_after_audio(reply: SSEReply, code: str) -> bytes:
    """Some audio, then one retryable `error`, then the end; returns the audio."""
    names = reply.names
    assert names.count("error") == 1
    assert names[-3:] == ["audio_stream_end", "error", "agent_end"]
    assert "audio_chunk" in names
    assert max(i for i, n in enumerate(names) if n == "audio_chunk") < names.index("error")
    error = reply.one("error")
    assert (error["code"], error["retryable"]) == (code, True)
    pcm = b"".join(reply.audio_chunks())
    assert len(pcm) > 0
    assert len(pcm) == reply.one("agent_end")["metrics"]["audio_bytes"]
    return pcm


def assert_retryable_error_without_audio(reply: SSEReply, code: str) -> None:
    assert [n for n in reply.names if n != "text_delta"] == [
        "agent_start",
        "audio_stream_start",
        "audio_stream_end",
        "error",
        "agent_end",
    ]
    error = reply.one("error")
    assert (error["code"], error["retryable"]) == (code, True)
    assert reply.one("agent_end")["metrics"]["audio_bytes"] == 0


# Codes at open: the bidi API's own (modeled in the HTTP/2 SDK) and the ones it shares with the
# other SageMaker APIs (not modeled there: the SDK raises a generic CallError that names them
# only in its message, which gateway/aws_errors.py reads).
BIDI_OPEN_FAULTS = [
    pytest.param(400, "ThrottlingException", id="ThrottlingException"),
    pytest.param(429, "ModelNotReadyException", id="ModelNotReadyException"),
    pytest.param(503, "ServiceUnavailableError", id="ServiceUnavailableError"),
    pytest.param(500, "InternalServerError", id="InternalServerError"),
]


# --- SageMaker bidi (mode bidi) ------------------------------------------------------------------


@pytest.mark.parametrize(("status", "code"), BIDI_OPEN_FAULTS)
async def test_bidi_refused_at_open_is_retried(
    sagemaker: SageMaker, status: int, code: str
) -> None:
    script = sagemaker.bidi
    script.fail_first, script.fail_status, script.fail_code = 2, status, code
    before = await tts_retries(sagemaker.gateway)
    reply = await speak(sagemaker.gateway, "bidi")
    assert_whole_audio(reply)
    assert (script.refused, script.streams) == (2, 1)
    assert await tts_retries(sagemaker.gateway) - before == 2


@pytest.mark.parametrize(("status", "code"), BIDI_OPEN_FAULTS)
async def test_bidi_refused_at_every_open_is_a_retryable_error(
    sagemaker: SageMaker, status: int, code: str
) -> None:
    script = sagemaker.bidi
    script.fail_first, script.fail_status, script.fail_code = 100, status, code
    before = await tts_retries(sagemaker.gateway)
    reply = await speak(sagemaker.gateway, "bidi")
    assert_retryable_error_without_audio(reply, f"tts_{code}")
    assert (script.refused, script.streams) == (ATTEMPTS, 0)
    assert await tts_retries(sagemaker.gateway) - before == ATTEMPTS - 1


async def test_bidi_model_stream_error_before_audio_is_retried(sagemaker: SageMaker) -> None:
    script = sagemaker.bidi
    script.model_error_after, script.stream_error_times = 0, 1
    before = await tts_retries(sagemaker.gateway)
    reply = await speak(sagemaker.gateway, "bidi")
    assert_whole_audio(reply)
    assert script.streams == 2
    assert audio_parts(script) == expected_pcm_bytes(TEXT)  # all from the second stream
    # the new stream was sent the chunk again, then closed once its audio was in
    assert synthesized(script) == [TEXT, TEXT]
    assert orjson.loads(script.container_messages[-1][1]) == {"type": "close"}
    assert await tts_retries(sagemaker.gateway) - before == 1


async def test_bidi_persistent_model_stream_error_before_audio(sagemaker: SageMaker) -> None:
    script = sagemaker.bidi
    script.model_error_after = 0  # every stream breaks before its first audio
    reply = await speak(sagemaker.gateway, "bidi")
    assert_retryable_error_without_audio(reply, "tts_ModelStreamError")
    assert script.streams == ATTEMPTS
    assert audio_parts(script) == 0


async def test_bidi_model_stream_error_after_audio_ends_the_reply(
    sagemaker: SageMaker, caplog: pytest.LogCaptureFixture
) -> None:
    script = sagemaker.bidi
    script.model_error_after = 1  # the first audio part goes back, then the stream breaks
    before = await tts_retries(sagemaker.gateway)
    reply = await speak(sagemaker.gateway, "bidi", LONG_TEXT)
    pcm = assert_retryable_error_after_audio(reply, "tts_ModelStreamError")
    # the client reads the code; what the service said, and of which endpoint, the log does
    assert reply.one("error")["message"] == "SageMaker answered ModelStreamError"
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.reply.pipeline"]
    assert [m.split(": ", 1)[1] for m in logged] == [
        "SageMaker ModelStreamError on endpoint 'kokoro-tts': injected ModelStreamError"
    ]
    assert synthesized(script)[0] == "Hello there."
    assert len(pcm) == audio_parts(script) == expected_pcm_bytes("Hello there.")
    assert script.streams == 1  # never retried: the listener has heard part of it
    assert await tts_retries(sagemaker.gateway) - before == 0


async def test_bidi_model_stream_error_after_audio_over_the_websocket(
    sagemaker: SageMaker,
) -> None:
    script = sagemaker.bidi
    script.model_error_after = 1
    events: list[dict[str, Any]] = []
    audio = b""
    async with connect(sagemaker.gateway.ws_url + "/v1/speak/ws") as ws:
        speak_msg = {"type": "speak", "text": LONG_TEXT, "format": "pcm", "utterance_id": "u1"}
        await ws.send(orjson.dumps(speak_msg).decode())
        while not events or events[-1]["type"] != "agent_end":
            frame = await ws.recv()
            if isinstance(frame, bytes):
                uid, data = split_audio_frame(frame)
                assert uid == "u1"
                audio += data
                events.append({"type": "audio"})
            else:
                events.append(orjson.loads(frame))
        types = [e["type"] for e in events]
        assert types[-2:] == ["error", "agent_end"]
        assert "audio" in types[: types.index("error")]
        error = events[-2]
        assert (error["code"], error["retryable"], error["utterance_id"]) == (
            "tts_ModelStreamError",
            True,
            "u1",
        )
        assert len(audio) == audio_parts(script) == expected_pcm_bytes("Hello there.")
        # the connection stays: the next utterance plays whole
        script.model_error_after = None
        await ws.send(orjson.dumps({**speak_msg, "utterance_id": "u2"}).decode())
        audio, event = await ws_reply_audio(ws)
    assert len(audio) == event["metrics"]["audio_bytes"] > expected_pcm_bytes("Hello there.")
    assert script.streams == 2


# --- SageMaker response stream (mode batch) ------------------------------------------------------

STREAM_OPEN_FAULTS = [
    (400, "ThrottlingException"),
    (429, "ModelNotReadyException"),
    (503, "ServiceUnavailable"),
    (500, "InternalFailure"),
]


@pytest.mark.parametrize(("status", "code"), STREAM_OPEN_FAULTS)
async def test_stream_refused_is_retried(sagemaker: SageMaker, status: int, code: str) -> None:
    script = sagemaker.stream
    script.fail_first, script.fail_status, script.fail_code = 2, status, code
    before = await tts_retries(sagemaker.gateway)
    reply = await speak(sagemaker.gateway, "batch")
    assert_whole_audio(reply)
    assert (len(script.requests), script.refused) == (3, 2)
    assert await tts_retries(sagemaker.gateway) - before == 2


@pytest.mark.parametrize(("status", "code"), STREAM_OPEN_FAULTS)
async def test_stream_refused_every_time_is_a_retryable_error(
    sagemaker: SageMaker, status: int, code: str
) -> None:
    script = sagemaker.stream
    script.fail_first, script.fail_status, script.fail_code = 100, status, code
    before = await tts_retries(sagemaker.gateway)
    reply = await speak(sagemaker.gateway, "batch")
    assert_retryable_error_without_audio(reply, f"tts_{code}")
    assert (len(script.requests), script.refused) == (ATTEMPTS, ATTEMPTS)
    assert await tts_retries(sagemaker.gateway) - before == ATTEMPTS - 1


@pytest.mark.parametrize(
    ("field", "code"),
    [
        ("model_error_after", "ModelStreamError"),
        ("internal_failure_after", "InternalStreamFailure"),
    ],
)
async def test_stream_error_before_audio_is_retried(
    sagemaker: SageMaker, field: str, code: str
) -> None:
    script = sagemaker.stream
    setattr(script, field, 0)
    script.stream_error_times = 1
    before = await tts_retries(sagemaker.gateway)
    reply = await speak(sagemaker.gateway, "batch")
    assert_whole_audio(reply)
    assert len(script.requests) == 2
    assert sum(script.parts) == expected_pcm_bytes(TEXT)  # all from the second stream
    assert await tts_retries(sagemaker.gateway) - before == 1


@pytest.mark.parametrize(
    ("field", "code"),
    [
        ("model_error_after", "ModelStreamError"),
        ("internal_failure_after", "InternalStreamFailure"),
    ],
)
async def test_stream_error_after_audio_ends_the_reply(
    sagemaker: SageMaker, field: str, code: str
) -> None:
    script = sagemaker.stream
    setattr(script, field, 2000)  # some parts (at most 777 bytes each) go first
    before = await tts_retries(sagemaker.gateway)
    reply = await speak(sagemaker.gateway, "batch")
    pcm = assert_retryable_error_after_audio(reply, f"tts_{code}")
    assert len(pcm) <= sum(script.parts) <= 2000  # what was sent, realigned to whole samples
    assert len(script.requests) == 1  # never retried
    assert await tts_retries(sagemaker.gateway) - before == 0


async def test_stream_persistent_model_stream_error_before_audio(sagemaker: SageMaker) -> None:
    script = sagemaker.stream
    script.model_error_after = 0  # every stream breaks before its first byte
    reply = await speak(sagemaker.gateway, "batch")
    assert_retryable_error_without_audio(reply, "tts_ModelStreamError")
    assert len(script.requests) == ATTEMPTS
    assert script.parts == []


# --- Bedrock (--llm bedrock) ---------------------------------------------------------------------


@dataclass
class Bedrock:
    gateway: RunningServer
    script: BedrockScript


def _bedrock_script() -> BedrockScript:
    return BedrockScript(answer=ANSWER)


@pytest.fixture(scope="module")
def _bedrock(fake_server: RunningServer) -> Iterator[Bedrock]:
    script = _bedrock_script()
    with (
        serve(create_bedrock_emulator(script)) as emulator,
        pytest.MonkeyPatch.context() as mp,
    ):
        _aws_env(mp, AWS_ENDPOINT_URL_BEDROCK_RUNTIME=emulator.http_url)
        settings = GatewaySettings(
            model_server_url=fake_server.http_url,
            llm="bedrock",
            aws_region="us-east-1",
            bedrock_model_id="anthropic.test-model",
            first_audio_budget_s=BUDGET_S,
            chunk_plan="sentences",  # every sentence as it is final: no waits for playback
        )
        with serve(create_gateway(settings)) as gateway:
            yield Bedrock(gateway, script)


@pytest.fixture
def bedrock(_bedrock: Bedrock) -> Bedrock:
    _reset(_bedrock.script, _bedrock_script)
    return _bedrock


async def ask(gateway: RunningServer) -> SSEReply:
    return await sse_get(gateway.http_url, {"prompt": "Tell me.", "format": "pcm"})


def assert_whole_answer(reply: SSEReply) -> None:
    assert "error" not in reply.names, reply.data("error")
    assert "".join(d["text"] for d in reply.data("text_delta")) == ANSWER
    assert [d["seq"] for d in reply.data("text_delta")] == list(
        range(len(reply.data("text_delta")))
    )
    assert reply.audio_chunks()
    assert reply.names[-1] == "agent_end"


@pytest.mark.parametrize(
    ("setup", "what"),
    [
        ({"fail_first": 2}, "ThrottlingException (429) before the stream"),
        (
            {"fail_first": 2, "fail_status": 503, "fail_code": "ServiceUnavailableException"},
            "ServiceUnavailableException (503) before the stream",
        ),
        (
            {"stream_error_after": 0, "stream_error": "throttlingException"},
            "throttlingException event before the first text",
        ),
        (
            {"stream_error_after": 0, "stream_error": "modelStreamErrorException"},
            "modelStreamErrorException event before the first text",
        ),
        (
            {"stream_error_after": 0, "stream_error": "internalServerException"},
            "internalServerException event before the first text",
        ),
    ],
    ids=["http-throttling", "http-unavailable", "throttling", "model-stream", "internal"],
)
async def test_bedrock_fault_before_the_first_text_is_retried(
    bedrock: Bedrock, setup: dict[str, Any], what: str
) -> None:
    script = bedrock.script
    for name, value in setup.items():
        setattr(script, name, value)
    if "stream_error_after" in setup:
        script.stream_error_times = 2
    before = await counted(bedrock.gateway, "gateway_retries_total", hop="llm")
    reply = await ask(bedrock.gateway)
    assert_whole_answer(reply)
    assert len(script.requests) == 3, what  # two refused or broken, then the answer
    assert await counted(bedrock.gateway, "gateway_retries_total", hop="llm") - before == 2


@pytest.mark.parametrize(
    "kind", ["modelStreamErrorException", "internalServerException", "throttlingException"]
)
async def test_bedrock_fault_after_text_ends_the_reply(bedrock: Bedrock, kind: str) -> None:
    script = bedrock.script
    script.stream_error_after, script.stream_error = 3, kind
    reply = await ask(bedrock.gateway)
    # the text already sent stays sent; nothing is retracted and nothing repeats
    assert [d["text"] for d in reply.data("text_delta")] == TOKENS
    names = reply.names
    assert names.count("error") == 1
    assert names[-2:] == ["error", "agent_end"]
    assert max(i for i, n in enumerate(names) if n == "text_delta") < names.index("error")
    error = reply.one("error")
    assert (error["code"], error["retryable"]) == ("llm_error", True)
    assert kind in error["message"]
    assert reply.one("agent_end")["metrics"]["text_chars"] == len("".join(TOKENS))
    assert len(script.requests) == 1  # never retried


@pytest.mark.parametrize(
    "setup",
    [{"fail_first": 100}, {"stream_error_after": 0, "stream_error": "throttlingException"}],
    ids=["http-throttling", "throttling-event"],
)
async def test_bedrock_persistent_throttling_is_a_retryable_error(
    bedrock: Bedrock, setup: dict[str, Any]
) -> None:
    script = bedrock.script
    for name, value in setup.items():
        setattr(script, name, value)
    before = await counted(bedrock.gateway, "gateway_retries_total", hop="llm")
    reply = await ask(bedrock.gateway)
    assert "text_delta" not in reply.names
    assert reply.names[-2:] == ["error", "agent_end"]
    error = reply.one("error")
    assert (error["code"], error["retryable"]) == ("llm_error", True)
    assert "throttlingexception" in error["message"].lower()
    assert len(script.requests) == ATTEMPTS
    retries = await counted(bedrock.gateway, "gateway_retries_total", hop="llm")
    assert retries - before == ATTEMPTS - 1
