"""The Bedrock AgentCore Runtime contract on the gateway: `POST /invocations` with the reference
agent's payload answering `data:`-only events that name their `type`, the runtime session
header keying the conversation, `GET /ping`, and `GET /ws` speaking the speak WebSocket."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from dockerfile_parse import DockerfileParser
from websockets.asyncio.client import connect

from deploy.agentcore import gateway_environment
from gateway.app import create_app as create_gateway
from gateway.config import ENV_PREFIX, parse_settings
from gateway.config import Settings as GatewaySettings
from tests.support.gateway_client import ws_reply_audio
from tests.support.openai_stub import create_stub, llm_gateway_settings
from tests.support.servers import RunningServer, serve

ROOT = Path(__file__).resolve().parents[3]
SESSION = "agentcore-session-0123456789abcdef-1"  # 36 characters
HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
ANSWER = ["Sure", ", here", " it", " is."]


async def invoke(base: str, body: dict[str, Any], **headers: str) -> list[dict[str, Any]]:
    """The events of one invocation, each read from its `data:` line alone."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        response = await http.post("/invocations", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = []
    for block in response.text.replace("\r\n", "\n").split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        assert all(line.startswith("data: ") for line in lines), block  # no event: or id:
        events.append(orjson.loads("".join(line.removeprefix("data: ") for line in lines)))
    return events


async def test_an_invocation_answers_data_only_events_naming_their_type(
    gateway_on_fake: RunningServer,
) -> None:
    events = await invoke(gateway_on_fake.http_url, {"text": "Hello there.", "format": "pcm"})
    types = [e["type"] for e in events]
    assert types[0] == "agent_start"
    assert types[-1] == "agent_end"
    assert "audio_chunk" in types
    assert "error" not in types
    pcm = b"".join(base64.b64decode(e["data"]) for e in events if e["type"] == "audio_chunk")
    assert len(pcm) == events[-1]["metrics"]["audio_bytes"]
    text = "".join(e["text"] for e in events if e["type"] == "text_delta")
    assert text == "Hello there."


async def test_bad_input_is_refused_before_the_stream(gateway_on_fake: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        empty = await http.post("/invocations", json={"speed": 1.0})
        assert (empty.status_code, empty.json()["error"]["code"]) == (400, "missing_text")
        short = await http.post("/invocations", json={"text": "Hi."}, headers={HEADER: "short"})
        assert (short.status_code, short.json()["error"]["code"]) == (400, "invalid_session_id")


async def test_the_session_header_keys_the_conversation(fake_server: RunningServer) -> None:
    with serve(create_stub(ANSWER)) as llm:
        settings = llm_gateway_settings(fake_server.http_url, llm.http_url)
        with serve(create_gateway(settings)) as gw:
            first = await invoke(
                gw.http_url, {"prompt": "Tell me.", "mode": "bidi"}, **{HEADER: SESSION}
            )
            assert [e["type"] for e in first][-1] == "agent_end"
            await invoke(gw.http_url, {"prompt": "And then?"}, **{HEADER: SESSION})
            other = SESSION.replace("1", "2")
            await invoke(gw.http_url, {"prompt": "Who are you?"}, **{HEADER: other})
        requests = llm.app.state.requests
    turns = [
        [(m["role"], m["content"]) for m in r["messages"] if m["role"] != "system"]
        for r in requests
    ]
    assert turns[0] == [("user", "Tell me.")]
    assert turns[1] == [("user", "Tell me."), ("assistant", "".join(ANSWER)), ("user", "And then?")]
    assert turns[2] == [("user", "Who are you?")]  # another session: its own conversation


async def test_an_llm_failure_is_an_error_event_in_band(fake_server: RunningServer) -> None:
    with serve(create_stub(ANSWER)) as llm:
        settings = llm_gateway_settings(
            fake_server.http_url, llm.http_url, openai_model="missing-model"
        )
        with serve(create_gateway(settings)) as gw:
            events = await invoke(gw.http_url, {"prompt": "Hi?"})
    assert [e["type"] for e in events][-2:] == ["error", "agent_end"]
    assert events[-2]["code"] == "llm_error"


async def test_ping_and_the_websocket(gateway_on_fake: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        assert (await http.get("/ping")).json() == {"status": "Healthy"}
        async with connect(gateway_on_fake.ws_url + "/ws") as ws:
            assert (await http.get("/ping")).json() == {
                "status": "HealthyBusy"
            }  # a session is open
            speak = {"type": "speak", "text": "Hello there.", "format": "pcm"}
            await ws.send(orjson.dumps(speak).decode())
            audio, end = await ws_reply_audio(ws)
        assert len(audio) == end["metrics"]["audio_bytes"]


async def test_the_contract_follows_the_access_rules(fake_server: RunningServer) -> None:
    key = "agentcore-key-0123456789"
    settings = GatewaySettings(model_server_url=fake_server.http_url, api_keys=key)
    with serve(create_gateway(settings)) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url) as http:
            refused = await http.post("/invocations", json={"text": "Hi."})
            assert (refused.status_code, refused.json()["error"]["code"]) == (401, "unauthorized")
            assert (await http.get("/ping")).status_code == 200  # the runtime's probe
            auth = {"Authorization": f"Bearer {key}"}
            served = await http.post(
                "/invocations", json={"text": "Hi.", "format": "pcm"}, headers=auth
            )
            assert served.status_code == 200
            assert '"type":"agent_end"' in served.text


def _image_env() -> dict[str, str]:
    """The gateway settings docker/gateway-agentcore.Dockerfile gives its process."""
    parser = DockerfileParser(str(ROOT / "docker" / "gateway-agentcore.Dockerfile"))
    return {k: v for k, v in parser.envs.items() if k.startswith(ENV_PREFIX)}


async def test_the_agentcore_image_serves_the_contract_only_once_the_operator_says_so(
    fake_server: RunningServer,
) -> None:
    """The image alone listens beyond loopback without keys, so the gateway refuses to start;
    with the environment `kokoro-deploy agentcore` gives the runtime it serves the contract to
    callers AgentCore has authenticated: no credentials of its own, whatever Host the runtime
    sends."""
    image = _image_env()
    assert (image["GATEWAY_HOST"], image["GATEWAY_PORT"]) == ("0.0.0.0", "8080")
    with pytest.raises(ValueError, match="without API keys"):
        create_gateway(parse_settings([], env=image))
    runtime = gateway_environment(region="us-east-1", model_server_url=fake_server.http_url)
    settings = parse_settings([], env=image | {**runtime, "GATEWAY_LLM": "echo"})
    with serve(create_gateway(settings)) as gw:  # on a loopback port of the test's choosing
        headers = {"Host": "runtime.bedrock-agentcore.internal", HEADER: SESSION}
        events = await invoke(gw.http_url, {"text": "Hello there.", "format": "pcm"}, **headers)
        async with httpx.AsyncClient(base_url=gw.http_url) as http:
            ping = await http.get("/ping", headers={"Host": "10.0.0.9:8080"})
    assert [e["type"] for e in events][-1] == "agent_end"
    assert "error" not in [e["type"] for e in events]
    assert ping.json() == {"status": "Healthy"}
