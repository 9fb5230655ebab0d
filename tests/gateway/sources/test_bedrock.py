"""Bedrock ConverseStream through the real aioboto3 client against the local emulator."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import orjson
import pytest
from websockets.asyncio.client import connect

from emulators.bedrock import BedrockScript, create_bedrock_emulator
from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from tests.support.gateway_client import counted, sse_get
from tests.support.servers import RunningServer, serve

ANSWER = "Sure, here is the answer you asked for. It comes from Bedrock."
TOKENS = [
    "Sure, ",
    "here ",
    "is ",
    "the ",
    "answer ",
    "you ",
    "asked ",
    "for. ",
    "It ",
    "comes ",
    "from ",
    "Bedrock.",
]


@pytest.fixture
def bedrock() -> Iterator[tuple[RunningServer, BedrockScript]]:
    script = BedrockScript(answer=ANSWER)
    with serve(create_bedrock_emulator(script)) as running:
        yield running, script


@pytest.fixture
def bedrock_settings(
    bedrock: tuple[RunningServer, BedrockScript],
    fake_server: RunningServer,
    monkeypatch: pytest.MonkeyPatch,
    aws_env: None,
) -> GatewaySettings:
    emulator, _ = bedrock
    monkeypatch.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", emulator.http_url)
    return GatewaySettings(
        model_server_url=fake_server.http_url,
        llm="bedrock",
        aws_region="us-east-1",
        bedrock_model_id="anthropic.test-model",
        max_tokens=200,
        temperature=0.2,
        system_prompt="Speak plainly.",
    )


@pytest.fixture
def gateway_bedrock(bedrock_settings: GatewaySettings) -> Iterator[RunningServer]:
    with serve(create_gateway(bedrock_settings)) as running:
        yield running


async def test_prompt_streams_from_bedrock(
    gateway_bedrock: RunningServer, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    reply = await sse_get(gateway_bedrock.http_url, {"prompt": "Tell me.", "format": "pcm"})
    assert [d["text"] for d in reply.data("text_delta")] == TOKENS
    assert "error" not in reply.names
    assert reply.one("audio_stream_end")["duration_s"] > 0
    (request,) = script.requests
    assert script.model_ids == ["anthropic.test-model"]
    assert request["system"] == [{"text": "Speak plainly."}]
    assert request["inferenceConfig"] == {"maxTokens": 200, "temperature": 0.2}
    assert request["messages"] == [{"role": "user", "content": [{"text": "Tell me."}]}]


async def test_throttling_before_the_first_text_is_retried(
    gateway_bedrock: RunningServer, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    script.fail_first = 2
    reply = await sse_get(gateway_bedrock.http_url, {"prompt": "Tell me."})
    assert "error" not in reply.names
    assert "".join(d["text"] for d in reply.data("text_delta")) == ANSWER
    assert len(script.requests) == 3


async def test_persistent_throttling_is_a_retryable_error(
    gateway_bedrock: RunningServer, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    script.fail_first = 100
    reply = await sse_get(gateway_bedrock.http_url, {"prompt": "Tell me."})
    error = reply.one("error")
    assert (error["code"], error["retryable"]) == ("llm_error", True)
    assert "ThrottlingException" in error["message"]
    assert len(script.requests) == 4  # max_attempts


async def test_a_mid_stream_error_ends_the_reply(
    gateway_bedrock: RunningServer, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    script.stream_error_after = 3
    reply = await sse_get(gateway_bedrock.http_url, {"prompt": "Tell me."})
    assert [d["text"] for d in reply.data("text_delta")] == TOKENS[:3]
    assert reply.names[-2:] == ["error", "agent_end"]
    error = reply.one("error")
    assert (error["code"], error["retryable"]) == ("llm_error", True)
    assert "modelStreamErrorException" in error["message"]
    script.stream_error_after = None
    again = await sse_get(gateway_bedrock.http_url, {"prompt": "Tell me."})
    assert "error" not in again.names


async def test_validation_error_names_the_setting_in_the_log(
    bedrock_settings: GatewaySettings, caplog: pytest.LogCaptureFixture
) -> None:
    settings = dataclasses.replace(bedrock_settings, bedrock_model_id="invalid.model")
    with caplog.at_level(logging.WARNING, "gateway"), serve(create_gateway(settings)) as gw:
        reply = await sse_get(gw.http_url, {"prompt": "Hi?"})
    error = reply.one("error")
    assert error["retryable"] is False
    assert error["message"] == "Bedrock answered ValidationException"  # no model, no setting
    logged = [r.getMessage() for r in caplog.records if "ValidationException" in r.getMessage()]
    assert any("GATEWAY_BEDROCK_MODEL_ID" in m and "invalid.model" in m for m in logged)


async def test_websocket_conversation_history_reaches_bedrock(
    gateway_bedrock: RunningServer, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    async with connect(gateway_bedrock.ws_url + "/v1/speak/ws") as ws:
        for prompt in ("First?", "Second?"):
            await ws.send(orjson.dumps({"type": "speak", "prompt": prompt}).decode())
            while True:
                frame = await ws.recv()
                if isinstance(frame, str) and orjson.loads(frame)["type"] == "agent_end":
                    break
    assert script.requests[1]["messages"] == [
        {"role": "user", "content": [{"text": "First?"}]},
        {"role": "assistant", "content": [{"text": ANSWER}]},
        {"role": "user", "content": [{"text": "Second?"}]},
    ]


# --- stop reasons, usage, and settings Bedrock would refuse -------------------------------


async def test_the_stop_reason_reaches_the_client_and_the_metrics(
    gateway_bedrock: RunningServer, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    before = await counted(gateway_bedrock, "gateway_llm_stop_reasons_total", reason="max_tokens")
    tokens = await counted(gateway_bedrock, "gateway_llm_tokens_total", kind="outputTokens")
    script.stop_reason = "max_tokens"  # the answer was cut, not finished
    reply = await sse_get(gateway_bedrock.http_url, {"prompt": "Tell me.", "format": "pcm"})
    assert reply.one("agent_end")["stop_reason"] == "max_tokens"
    after = await counted(gateway_bedrock, "gateway_llm_stop_reasons_total", reason="max_tokens")
    assert after - before == 1
    used = await counted(gateway_bedrock, "gateway_llm_tokens_total", kind="outputTokens")
    assert used - tokens == len(TOKENS)  # the emulator's usage: one token a delta
    script.stop_reason = "end_turn"
    again = await sse_get(gateway_bedrock.http_url, {"prompt": "Tell me.", "format": "pcm"})
    assert again.one("agent_end")["stop_reason"] == "end_turn"


async def test_a_temperature_over_one_fails_at_the_start_unretried(
    bedrock_settings: GatewaySettings, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    with serve(create_gateway(dataclasses.replace(bedrock_settings, temperature=1.5))) as gw:
        reply = await sse_get(gw.http_url, {"prompt": "Hi?"})
    error = reply.one("error")
    assert (error["code"], error["retryable"]) == ("llm_error", False)
    assert "temperature from 0 to 1, not 1.5 (GATEWAY_TEMPERATURE)" in error["message"]
    assert script.requests == []


async def test_an_empty_system_prompt_is_not_sent(
    bedrock_settings: GatewaySettings, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    with serve(create_gateway(dataclasses.replace(bedrock_settings, system_prompt=""))) as gw:
        reply = await sse_get(gw.http_url, {"prompt": "Hi?"})
    assert "error" not in reply.names
    (request,) = script.requests
    assert "system" not in request


async def test_a_request_the_service_model_refuses_is_not_retried_as_unreachable(
    bedrock_settings: GatewaySettings, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    with serve(create_gateway(dataclasses.replace(bedrock_settings, max_tokens=0))) as gw:
        reply = await sse_get(gw.http_url, {"prompt": "Hi?"})
    error = reply.one("error")
    assert error["retryable"] is False
    assert "Bedrock refused the request" in error["message"]
    assert "unreachable" not in error["message"]
    assert script.requests == []  # botocore refused it before sending


async def test_a_model_timeout_is_retried(
    gateway_bedrock: RunningServer, bedrock: tuple[RunningServer, BedrockScript]
) -> None:
    _, script = bedrock
    script.fail_first, script.fail_status, script.fail_code = 1, 408, "ModelTimeoutException"
    reply = await sse_get(gateway_bedrock.http_url, {"prompt": "Tell me."})
    assert "error" not in reply.names
    assert len(script.requests) == 2
