"""The model server's shared key: beyond loopback it needs one (or `--allow-anonymous`), every
route but /ping checks it, and the gateway's transports send it on every call."""

from __future__ import annotations

import socket
import subprocess
import sys
from contextlib import AbstractContextManager

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from model_server.access import check_listening
from tests.support.fakes import FakeEngine, serve_fake
from tests.support.gateway_client import sse_get
from tests.support.model_server_client import read_until_terminal, synth
from tests.support.servers import RunningServer, serve

KEY = "model-key-0123456789abcdef"


def keyed_model_server(engine: FakeEngine) -> AbstractContextManager[RunningServer]:
    return serve_fake(engine, api_key=KEY)


def test_beyond_loopback_a_key_or_anonymity_said_out_loud() -> None:
    with pytest.raises(ValueError, match="--allow-anonymous"):
        check_listening("0.0.0.0", "", allow_anonymous=False)
    with pytest.raises(ValueError, match="shorter than 16"):
        check_listening("0.0.0.0", "short", allow_anonymous=False)
    check_listening("0.0.0.0", KEY, allow_anonymous=False)
    check_listening("0.0.0.0", "", allow_anonymous=True)
    check_listening("127.0.0.1", "", allow_anonymous=False)


@pytest.mark.slow
def test_the_command_refuses_to_listen_beyond_loopback_without_a_key() -> None:
    command = [sys.executable, "-c", "from model_server.cli import main; main()"]
    done = subprocess.run(
        [*command, "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "model-server: listening on 0.0.0.0 (beyond loopback) without a key: give --api-key "
        "(MODEL_SERVER_API_KEY, the gateways' --model-server-key), or say --allow-anonymous"
    ]
    with socket.socket() as taken:  # with the flag it goes on, up to the port (in use here)
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        anonymous = [*command, "--host", "0.0.0.0", "--allow-anonymous", "true", "--port", port]
        done = subprocess.run(anonymous, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "cannot listen on 0.0.0.0:" in done.stderr


async def test_every_route_but_ping_needs_the_key(fake_engine: FakeEngine) -> None:
    with keyed_model_server(fake_engine) as server:
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            assert (await http.get("/ping")).status_code == 200
            for method, path in [("GET", "/load"), ("GET", "/voices"), ("GET", "/metrics")]:
                for headers in ({}, {"Authorization": "Bearer " + "x" * 26}):
                    refused = await http.request(method, path, headers=headers)
                    assert refused.status_code == 401, path
                    assert refused.json()["error"]["code"] == "unauthorized"
                    assert refused.headers["www-authenticate"] == 'Bearer realm="model-server"'
            post = await http.post("/invocations", json={"text": "Hi."})
            assert post.status_code == 401
            assert (await http.post("/phonemize", json={"text": "Hi."})).status_code == 401
            assert fake_engine.calls == []
            auth = {"Authorization": f"Bearer {KEY}"}
            assert (await http.get("/load", headers=auth)).status_code == 200
            spoken = await http.post("/invocations", json={"text": "Hi."}, headers=auth)
            assert spoken.status_code == 200
            assert len(spoken.content) > 0
        with pytest.raises(InvalidStatus) as upgrade:
            async with connect(server.ws_url + "/invocations-bidirectional-stream"):
                pass
        assert upgrade.value.response.status_code == 401
        assert orjson.loads(upgrade.value.response.body)["error"]["code"] == "unauthorized"
        headers = {"Authorization": f"Bearer {KEY}"}
        url = server.ws_url + "/invocations-bidirectional-stream"
        async with connect(url, additional_headers=headers) as ws:
            await ws.send(synth("Keyed.", "k"))
            reply = await read_until_terminal(ws, "k")
        assert reply.last["type"] == "synthesis_complete"
        assert len(reply.pcm) > 0


@pytest.mark.parametrize("mode", ["bidi", "batch"])
async def test_the_gateway_sends_the_model_servers_key(fake_engine: FakeEngine, mode: str) -> None:
    with keyed_model_server(fake_engine) as server:
        keyed = GatewaySettings(model_server_url=server.http_url, model_server_key=KEY)
        with serve(create_gateway(keyed)) as gw:
            async with httpx.AsyncClient(base_url=gw.http_url) as http:
                assert (await http.get("/readyz")).json()["status"] == "ready"
                voices = await http.get("/v1/voices")
                assert "af_test" in {v["name"] for v in voices.json()["voices"]}
            reply = await sse_get(
                gw.http_url, {"text": "Hello there.", "mode": mode, "format": "pcm"}
            )
        assert "error" not in reply.names
        assert len(b"".join(reply.audio_chunks())) > 0
        keyless = GatewaySettings(model_server_url=server.http_url, retry_attempts=1)
        with serve(create_gateway(keyless)) as gw:
            async with httpx.AsyncClient(base_url=gw.http_url) as http:
                params = {"text": "Hi.", "mode": mode, "format": "pcm"}
                refused = await http.get("/v1/speak/sse", params=params)
        assert refused.status_code == 503  # its /load answers 401: no server it may use
        assert refused.json()["error"]["code"] == "tts_unavailable"
