"""The gateway in front of browsers, on real servers: keys and tokens, origins, limits, quotas,
and clients that misbehave. Each refusal is checked by its status, code and what it leaves
behind (sessions, model-server connections, counters)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.access.keys import Client, KeyRing
from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from model_server.app import create_app as create_model_server
from model_server.drain import wait_drained
from tests.conftest import FAKE_SETTINGS
from tests.support.fakes import FakeEngine, identity_g2p
from tests.support.gateway_client import (
    metric,
    read_reply,
    read_sse,
    split_audio_frame,
    wait_for_metric,
    ws_events,
)
from tests.support.servers import RunningServer, free_port, serve

KEY = "web-key-0123456789abcdef"
OTHER_KEY = "app-key-0123456789abcdef"
THIRD_KEY = "ops-key-0123456789abcdef"
KEYS = f"web:{KEY},app:{OTHER_KEY},ops:{THIRD_KEY}"
HI = {"text": "Hello there.", "format": "pcm"}


@contextlib.contextmanager
def gateway(fake_server: RunningServer, **settings: Any) -> Iterator[RunningServer]:
    # these are the access rules, not capacity: admission off unless a test asks, so the shared
    # fake server's speed, as earlier tests taught it, cannot refuse a reply asked for here
    settings.setdefault("admission", False)
    app = create_gateway(GatewaySettings(model_server_url=fake_server.http_url, **settings))
    with serve(app) as running:
        yield running


def auth(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def code_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def refused_upgrade(exc: pytest.ExceptionInfo[InvalidStatus]) -> tuple[int, str]:
    response = exc.value.response
    return response.status_code, orjson.loads(response.body)["error"]["code"]


async def speak_once(ws: ClientConnection, **fields: Any) -> tuple[bytes, list[dict[str, Any]]]:
    """One utterance over the WebSocket: its audio and its JSON events up to `agent_end`."""
    await ws.send(orjson.dumps({"type": "speak", **HI, **fields}).decode())
    return await ws_events(ws)


# --- keys and tokens ----------------------------------------------------------------------------


async def test_with_keys_every_v1_route_needs_credentials(fake_server: RunningServer) -> None:
    with gateway(fake_server, api_keys=KEYS) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            missing = [
                await http.post("/v1/speak", json=HI),
                await http.get("/v1/speak/sse", params=HI),
                await http.post("/v1/audio/speech", json={"input": "Hi."}),
                await http.get("/v1/voices"),
                await http.post("/v1/tokens", json={}),
            ]
            for r in missing:
                assert code_of(r) == (401, "unauthorized"), r.request.url
                assert r.headers["www-authenticate"].startswith("Bearer")
            wrong = await http.post("/v1/speak", json=HI, headers=auth("x" * 24))
            assert code_of(wrong) == (401, "unauthorized")
            # what is not /v1 stays open: the page, the module, health
            for path in ("/", "/static/speak.js", "/healthz", "/readyz"):
                assert (await http.get(path)).status_code == 200, path
            async with http.stream("POST", "/v1/speak", json=HI, headers=auth()) as r:
                assert r.status_code == 200, (r.status_code, await r.aread())
                reply = await read_sse(r)
            assert reply.names[-1] == "agent_end"
            assert len(b"".join(reply.audio_chunks())) > 0
        with pytest.raises(InvalidStatus) as upgrade:
            async with connect(gw.ws_url + "/v1/speak/ws"):
                pass
        assert refused_upgrade(upgrade) == (401, "unauthorized")
        async with connect(gw.ws_url + "/v1/speak/ws", additional_headers=auth()) as ws:
            audio, events = await speak_once(ws)
        assert len(audio) > 0
        assert events[-1]["type"] == "agent_end"
        assert await metric(gw, "gateway_errors_total", code="unauthorized") == 7


async def test_a_page_uses_a_token_minted_by_its_backend(fake_server: RunningServer) -> None:
    with gateway(fake_server, api_keys=KEYS, token_ttl_s=120) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            minted = await http.post("/v1/tokens", json={}, headers=auth())
            assert minted.status_code == 200
            assert minted.headers["cache-control"] == "no-store"
            token = minted.json()["token"]
            assert minted.json()["expires_in"] == 120
            # EventSource: the token in the query
            async with http.stream("GET", "/v1/speak/sse", params={**HI, "token": token}) as r:
                assert r.status_code == 200
                reply = await read_sse(r)
            assert len(b"".join(reply.audio_chunks())) > 0
            # a token cannot mint tokens (no token is bound to that route); a key cannot ride
            # in the query
            again = await http.post("/v1/tokens", json={}, headers=auth(token))
            assert code_of(again) == (403, "token_not_for_route")
            in_query = await http.get("/v1/speak/sse", params={**HI, "token": KEY})
            assert code_of(in_query) == (401, "unauthorized")
            # corrupted: the payload changed under its signature
            payload, signature = token.split(".")
            corrupted = payload[:-2] + "x." + signature
            corrupt = await http.get("/v1/voices", params={"token": corrupted})
            assert code_of(corrupt) == (401, "unauthorized")
            # forged: well formed, unexpired, for a name this gateway knows, signed by a key it
            # does not hold (another gateway's "web")
            elsewhere = KeyRing([("web", "not-this-gateways-key-0123456789")])
            forged = elsewhere.mint(Client("web"), time.time(), 120)
            refused = await http.get("/v1/voices", params={"token": forged})
            assert code_of(refused) == (401, "unauthorized")
            assert refused.json()["error"]["message"] == "invalid token"
            # the same claims signed with this gateway's key are let in: only the key differs
            genuine = KeyRing.parse(KEYS.split(",")).mint(Client("web"), time.time(), 120)
            assert (await http.get("/v1/voices", params={"token": genuine})).status_code == 200
        # a browser WebSocket: the token in the query too
        async with connect(f"{gw.ws_url}/v1/speak/ws?token={token}") as ws:
            audio, _ = await speak_once(ws)
        assert len(audio) > 0
        # later than its lifetime
        service = gw.app.state.service
        service.wall_clock = lambda: time.time() + 121
        with pytest.raises(InvalidStatus) as expired:
            async with connect(f"{gw.ws_url}/v1/speak/ws?token={token}"):
                pass
        assert refused_upgrade(expired) == (401, "unauthorized")
        assert orjson.loads(expired.value.response.body)["error"]["message"] == "token expired"


@pytest.mark.slow
def test_beyond_loopback_the_host_names_must_be_given() -> None:
    """A DNS-rebinding page names its own host: beyond loopback an empty list would let it in."""
    with pytest.raises(ValueError, match="--allowed-hosts"):
        create_gateway(GatewaySettings(host="0.0.0.0", api_keys=KEYS))
    with pytest.raises(ValueError, match="--allowed-hosts"):
        create_gateway(GatewaySettings(host="0.0.0.0", allow_anonymous=True))
    policy = create_gateway(GatewaySettings(host="0.0.0.0", api_keys=KEYS, allowed_hosts="*"))
    assert policy.state.service.keys is not None  # '*', said out loud: any Host
    cli = [sys.executable, "-c", "from gateway.cli import main; main()"]
    done = subprocess.run(
        [*cli, "--host", "0.0.0.0", "--api-keys", KEY, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "give --allowed-hosts" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_token_is_bound_to_its_routes_and_lifetime(fake_server: RunningServer) -> None:
    with pytest.raises(ValueError, match="--token-ttl-s: 1 to 3600"):
        create_gateway(GatewaySettings(api_keys=KEYS, token_ttl_s=86_400))
    with gateway(fake_server, api_keys=KEYS, token_ttl_s=600) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            minted = await http.post(
                "/v1/tokens", json={"routes": ["speak"], "ttl_s": 60}, headers=auth()
            )
            assert (minted.status_code, minted.json()["expires_in"]) == (200, 60)
            assert minted.json()["routes"] == ["speak"]
            token = minted.json()["token"]
            async with http.stream("GET", "/v1/speak/sse", params={**HI, "token": token}) as r:
                reply = await read_sse(r)
            assert len(b"".join(reply.audio_chunks())) > 0
            speech = await http.post("/v1/audio/speech", json={"input": "Hi."}, headers=auth(token))
            assert code_of(speech) == (403, "token_not_for_route")
            assert "speak" in speech.json()["error"]["message"]
            voices = await http.get("/v1/voices", params={"token": token})
            assert code_of(voices) == (403, "token_not_for_route")
            bodies: list[dict[str, Any]] = [
                {"ttl_s": 601},
                {"ttl_s": 0},
                {"routes": ["admin"]},
                {"routes": []},
            ]
            for body in bodies:
                bad = await http.post("/v1/tokens", json=body, headers=auth())
                assert code_of(bad) == (400, "invalid_field"), body
            default = (await http.post("/v1/tokens", json={}, headers=auth())).json()
            assert (default["expires_in"], default["routes"]) == (600, ["speak", "voices"])
            assert (
                await http.get("/v1/voices", params={"token": default["token"]})
            ).status_code == 200
        assert await metric(gw, "gateway_errors_total", code="token_not_for_route") == 2


async def test_a_saved_blend_is_its_keys_and_a_token_cannot_change_it(
    fake_server: RunningServer,
) -> None:
    blend = {"name": "warm", "blend": "jf_alpha(1)+af_test(2)"}
    with gateway(fake_server, api_keys=KEYS) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            assert (await http.post("/v1/voices", json=blend)).status_code == 401
            saved = await http.post("/v1/voices", json=blend, headers=auth())
            assert saved.status_code == 201
            token = (await http.post("/v1/tokens", json={}, headers=auth())).json()["token"]
            # the key's visitor lists and speaks it, never changes it
            listed = (await http.get("/v1/voices", params={"token": token})).json()["blends"]
            assert listed == [{"name": "warm", "blend": "af_test(2)+jf_alpha(1)"}]
            async with http.stream(
                "GET", "/v1/speak/sse", params={**HI, "voice": "warm", "token": token}
            ) as r:
                reply = await read_sse(r)
            assert len(b"".join(reply.audio_chunks())) > 0
            by_token = await http.post("/v1/voices", json=blend, headers=auth(token))
            assert code_of(by_token) == (403, "token_not_for_route")
            deleted = await http.delete("/v1/voices/warm", headers=auth(token))
            assert code_of(deleted) == (403, "token_not_for_route")
            # another key neither sees nor speaks it
            other = (await http.get("/v1/voices", headers=auth(OTHER_KEY))).json()["blends"]
            assert other == []
            refused = await http.get(
                "/v1/speak/sse", params={**HI, "voice": "warm"}, headers=auth(OTHER_KEY)
            )
            assert code_of(refused) == (400, "unknown_voice")
            assert (await http.delete("/v1/voices/warm", headers=auth())).status_code == 204


async def test_tokens_need_keys(gateway_on_fake: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        r = await http.post("/v1/tokens", json={})
    assert code_of(r) == (400, "tokens_unavailable")


@pytest.mark.slow
def test_anonymous_beyond_loopback_must_be_said_out_loud(tmp_path: Any) -> None:
    named: dict[str, Any] = {"host": "0.0.0.0", "allowed_hosts": "voice.example"}
    with pytest.raises(ValueError, match="--allow-anonymous"):
        create_gateway(GatewaySettings(**named))
    create_gateway(GatewaySettings(**named, allow_anonymous=True))
    create_gateway(GatewaySettings(**named, api_keys=KEYS))
    keys = tmp_path / "keys"
    keys.write_text(f"# the web front end\nweb:{KEY}\n{OTHER_KEY}\n")
    create_gateway(GatewaySettings(**named, api_keys_file=str(keys)))
    empty = tmp_path / "empty"
    empty.write_text("# nothing yet\n")
    with pytest.raises(ValueError, match="holds no key"):
        create_gateway(GatewaySettings(**named, api_keys_file=str(empty)))
    port = str(free_port())
    cli = [sys.executable, "-c", "from gateway.cli import main; main()"]
    done = subprocess.run(
        [*cli, "--host", "0.0.0.0", "--port", port], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "without API keys" in done.stderr
    assert "Traceback" not in done.stderr
    short = subprocess.run(
        [*cli, "--api-keys", "short", "--port", port], capture_output=True, text=True, timeout=60
    )
    assert short.returncode == 2
    assert "shorter than 16 characters" in short.stderr


@pytest.mark.slow
def test_help_shows_no_key() -> None:
    env = {"GATEWAY_API_KEYS": KEYS, "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-c", "from gateway.cli import main; main()", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0
    assert "--api-keys" in done.stdout
    assert KEY not in done.stdout
    assert "default set" in " ".join(done.stdout.split())


# --- origins, content types, hosts -------------------------------------------------------------


async def test_cross_site_requests_are_refused(gateway_on_fake: RunningServer) -> None:
    evil = {"Origin": "https://evil.example"}
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, timeout=15) as http:
        plain = {"Content-Type": "text/plain"}  # no CORS preflight for this one
        body = orjson.dumps(HI)
        cases = [
            await http.post("/v1/speak", content=body, headers={**plain, **evil}),
            await http.get("/v1/speak/sse", params=HI, headers=evil),
            await http.post("/v1/audio/speech", json={"input": "Hi."}, headers=evil),
            # an <img src> on another site: no Origin, but Sec-Fetch-Site says where it is from
            await http.get("/v1/speak/sse", params=HI, headers={"Sec-Fetch-Site": "cross-site"}),
        ]
        for r in cases:
            assert code_of(r) == (403, "origin_not_allowed"), r.request.url
        assert code_of(await http.post("/v1/speak", content=body, headers=plain)) == (
            415,
            "unsupported_media_type",
        )
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        assert (
            await http.post("/v1/audio/speech", content=b"a=b", headers=form)
        ).status_code == 415
        rebound = await http.get("/", headers={"Host": "evil.example"})
        assert code_of(rebound) == (400, "host_not_allowed")
        local = await http.get("/healthz", headers={"Host": "localhost:8000"})
        assert local.status_code == 200
    with pytest.raises(InvalidStatus) as denied:
        async with connect(gateway_on_fake.ws_url + "/v1/speak/ws", origin=evil["Origin"]):  # type: ignore[arg-type]
            pass
    assert refused_upgrade(denied) == (403, "origin_not_allowed")


async def test_allowed_origins_and_cors(fake_server: RunningServer) -> None:
    app_origin = "https://app.example"
    with gateway(fake_server, allowed_origins=app_origin + "/") as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            preflight = {"Access-Control-Request-Method": "POST"}
            ok = await http.options("/v1/speak", headers={**preflight, "Origin": app_origin})
            assert ok.headers["access-control-allow-origin"] == app_origin
            refused = await http.options(
                "/v1/speak", headers={**preflight, "Origin": "https://evil.example"}
            )
            assert "access-control-allow-origin" not in refused.headers
            async with http.stream(
                "POST", "/v1/speak", json=HI, headers={"Origin": app_origin}
            ) as r:
                assert r.headers["access-control-allow-origin"] == app_origin
                await read_reply(r)


# --- sizes --------------------------------------------------------------------------------------


async def test_bodies_past_the_limit_are_refused(fake_server: RunningServer) -> None:
    with gateway(fake_server, max_body_bytes=1024) as gw:
        big = orjson.dumps({**HI, "text": "Hello there. " * 100})

        async def chunked() -> AsyncIterator[bytes]:
            for _ in range(4):
                yield big[:600]

        json = {"Content-Type": "application/json"}
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15, headers=json) as http:
            declared = await http.post("/v1/speak", content=big)
            streamed = await http.post("/v1/speak", content=chunked())
            speech = await http.post("/v1/audio/speech", content=big)
            assert "content-length" not in streamed.request.headers
            for r in (declared, streamed, speech):
                assert code_of(r) == (413, "body_too_large")
            async with http.stream("POST", "/v1/speak", content=orjson.dumps(HI)) as r:
                await read_reply(r)
        assert await metric(gw, "gateway_errors_total", code="body_too_large") == 3


async def test_websocket_messages_past_the_limit_close_with_1009(
    fake_server: RunningServer,
) -> None:
    with gateway(fake_server, max_message_bytes=1024) as gw:
        async with connect(gw.ws_url + "/v1/speak/ws", max_size=None) as ws:
            await ws.send(orjson.dumps({"type": "speak", "text": "x " * 1000}).decode())
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009
        # the others are unaffected
        async with connect(gw.ws_url + "/v1/speak/ws") as ws:
            audio, _ = await speak_once(ws)
        assert len(audio) > 0


async def test_client_text_past_the_limit_is_refused_and_the_rest_is_spoken(
    fake_server: RunningServer,
) -> None:
    with gateway(fake_server, max_text_chars=60) as gw:
        async with connect(gw.ws_url + "/v1/speak/ws") as ws:
            await ws.send(orjson.dumps({"type": "speak", "format": "pcm"}).decode())
            await ws.send(
                orjson.dumps({"type": "text", "delta": "One two three four. " * 2}).decode()
            )
            await ws.send(orjson.dumps({"type": "text", "delta": "Too much now. " * 2}).decode())
            await ws.send('{"type": "flush"}')
            audio, events = b"", list[dict[str, Any]]()
            while not events or events[-1]["type"] != "agent_end":
                frame = await ws.recv()
                if isinstance(frame, bytes):
                    audio += split_audio_frame(frame)[1]
                else:
                    events.append(orjson.loads(frame))
        errors = [e for e in events if e["type"] == "error"]
        assert [e["code"] for e in errors] == ["text_too_long"]
        assert errors[0]["utterance_id"] == events[-1]["utterance_id"]
        spoken = "".join(str(e["text"]) for e in events if e["type"] == "text_delta")
        assert spoken == "One two three four. " * 2
        assert len(audio) == events[-1]["metrics"]["duration_s"] * 48_000


def test_the_chunker_cuts_text_without_spaces() -> None:
    from gateway.reply.chunker import IncrementalSentenceChunker

    chunker = IncrementalSentenceChunker()
    chunks = chunker.push("a" * 700) + chunker.flush()
    assert [len(c) for c in chunks] == [300, 300, 100]


# --- sessions and rates -------------------------------------------------------------------------


async def test_session_caps_refuse_before_accepting(fake_server: RunningServer) -> None:
    with gateway(fake_server, api_keys=KEYS, max_sessions=2, max_sessions_per_client=1) as gw:
        url = gw.ws_url + "/v1/speak/ws"
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(connect(url, additional_headers=auth(KEY)))
            with pytest.raises(InvalidStatus) as mine:
                async with connect(url, additional_headers=auth(KEY)):
                    pass
            assert refused_upgrade(mine) == (429, "too_many_sessions")
            assert mine.value.response.headers["Retry-After"] == "5"
            async with httpx.AsyncClient(base_url=gw.http_url, headers=auth(KEY)) as http:
                sse = await http.post("/v1/speak", json=HI)
            assert code_of(sse) == (429, "too_many_sessions")
            await stack.enter_async_context(connect(url, additional_headers=auth(OTHER_KEY)))
            assert await metric(gw, "gateway_open_sessions") == 2
            with pytest.raises(InvalidStatus) as full:
                async with connect(url, additional_headers=auth(THIRD_KEY)):
                    pass
            assert refused_upgrade(full) == (503, "overloaded")
        assert await wait_for_metric(gw, "gateway_open_sessions", 0) == 0
        async with connect(url, additional_headers=auth(THIRD_KEY)) as ws:
            audio, _ = await speak_once(ws)
        assert len(audio) > 0


async def test_replies_and_llm_tokens_per_minute(fake_server: RunningServer) -> None:
    with gateway(fake_server, replies_per_minute=3, llm_tokens_per_minute=10) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            prompt = {"prompt": "Tell me a story about a cat.", "format": "pcm"}  # 7 tokens
            async with http.stream("POST", "/v1/speak", json=prompt) as r:
                await read_reply(r)
            async with http.stream("POST", "/v1/speak", json=prompt) as r:  # 14 > 10 now
                await read_reply(r)
            tokens = await http.post("/v1/speak", json=prompt)
            assert code_of(tokens) == (429, "rate_limited")
            assert "LLM tokens" in tokens.json()["error"]["message"]
            async with http.stream("POST", "/v1/speak", json=HI) as r:  # text: no LLM
                await read_reply(r)
            replies = await http.post("/v1/speak", json=HI)
            assert code_of(replies) == (429, "rate_limited")
            assert 1 <= int(replies.headers["Retry-After"]) <= 60
        async with connect(gw.ws_url + "/v1/speak/ws") as ws:
            await ws.send(orjson.dumps({"type": "speak", **HI}).decode())
            error = orjson.loads(await ws.recv())
            assert (error["type"], error["code"], error["retryable"]) == (
                "error",
                "rate_limited",
                True,
            )
            await ws.send('{"type": "cancel"}')  # the session is still there
            assert orjson.loads(await ws.recv())["code"] == "nothing_to_cancel"
        assert await metric(gw, "gateway_errors_total", code="rate_limited") == 3
        assert await metric(gw, "gateway_open_sessions") == 0


# --- time limits --------------------------------------------------------------------------------


async def test_an_idle_websocket_is_closed(own_fake_server: RunningServer) -> None:
    with gateway(own_fake_server, idle_timeout_s=0.3) as gw:
        async with connect(gw.ws_url + "/v1/speak/ws") as ws:
            error = orjson.loads(await ws.recv())
            assert (error["type"], error["code"]) == ("error", "idle_timeout")
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1000
        # a speak that never sends its text holds a model-server session: idle too
        async with connect(gw.ws_url + "/v1/speak/ws") as ws:
            await ws.send('{"type": "speak", "format": "pcm"}')
            start = orjson.loads(await ws.recv())
            assert start["type"] == "agent_start"
            error = await next_error(ws)
            assert (error["code"], error["utterance_id"]) == ("idle_timeout", start["utterance_id"])
        assert await asyncio.to_thread(wait_drained, own_fake_server.http_url, 10, 0.02) == 0
        assert await wait_for_metric(gw, "gateway_open_sessions", 0) == 0
        # a reply that plays longer than the idle limit is not idle
        async with connect(gw.ws_url + "/v1/speak/ws") as ws:
            text = "One two three four five six seven eight nine ten. " * 2
            _, events = await speak_once(ws, text=text, echo_tps=40)
        assert events[-1]["type"] == "agent_end"
        assert events[-1]["metrics"]["total_ms"] > 300  # so it has outlived the idle limit
        assert not [e for e in events if e["type"] == "error"]


async def next_error(ws: ClientConnection) -> dict[str, Any]:
    while True:
        frame = await ws.recv()
        if isinstance(frame, str) and (event := orjson.loads(frame))["type"] == "error":
            return dict(event)


async def test_the_longest_reply(
    gateway_on_fake: RunningServer, fake_server: RunningServer
) -> None:
    with gateway(fake_server, max_reply_s=0.2) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            slow = {**HI, "text": "Word " * 40, "echo_tps": 20}  # two seconds of text
            async with http.stream("POST", "/v1/speak", json=slow) as r:
                reply = await read_sse(r)
        assert reply.names[-2:] == ["error", "agent_end"]
        assert reply.one("error")["code"] == "reply_too_long"
        assert await metric(gw, "gateway_errors_total", code="reply_too_long") == 1


async def test_a_client_that_stops_reading_is_dropped(fake_engine: FakeEngine) -> None:
    """Its reply would be over 13 minutes of PCM, far more than the sockets' buffers: the
    gateway keeps only bounded buffers, drops the client after the send timeout and closes the
    model-server session, so the engine stops: far fewer of the reply's sentences are ever
    synthesized than it has (the model server, over an engine of no cost, runs ahead of the
    client only by what the socket buffers between them hold). The client, reading at last,
    finds the stream cut short."""
    sentences = 2_000
    roomy = dataclasses.replace(FAKE_SETTINGS, max_pending=sentences)  # every sentence at once
    model = create_model_server(
        roomy, engine_factory=lambda _: fake_engine, g2p_factory=identity_g2p
    )
    sentence = "This is one more sentence to speak now."
    text = f"{sentence} " * sentences  # 800 s of audio: 50 MB as SSE
    settings = {
        "send_timeout_s": 0.5,
        "chunk_plan": "sentences",
        "max_text_chars": len(text),
        "max_body_bytes": 2 * len(text),
        "max_reply_audio_s": 0,  # past --max-reply-audio-s: it would be refused up front
    }
    with serve(model) as model_server, gateway(model_server, **settings) as gw:
        body = orjson.dumps({"text": text, "format": "pcm"})
        head = (
            "POST /v1/speak HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(("127.0.0.1", gw.port))
            sock.sendall(head.encode() + body)
            # not reading: the buffers fill, the gateway's sends wait, then it gives up
            assert await wait_for_metric(gw, "gateway_open_sessions", 1) == 1
            assert await wait_for_metric(gw, "gateway_open_sessions", 0) == 0
            assert await asyncio.to_thread(wait_drained, model_server.http_url, 20, 0.05) == 0
            # the session is gone: what the engine ran is final
            ran = await metric(model_server, "model_server_engine_calls_total")
            received = await asyncio.to_thread(read_to_end, sock)
        assert ran == len(fake_engine.calls)
        assert text.startswith(" ".join(fake_engine.calls))  # the reply's opening, in order
        # the engine stopped with it, not at the reply's end: 335 to 522 of the 2000 sentences on
        # a slower day, 1369 on a quiet machine (what the loopback buffers hold meanwhile)
        assert 0 < ran < sentences, ran
        assert received.startswith(b"HTTP/1.1 200 OK")
        assert b"event: audio_chunk" in received
        assert b"agent_end" not in received  # cut short, not finished
        # and the client got no more than the engine made
        assert received.count(b"event: audio_chunk") <= ran
        assert await metric(gw, "gateway_active_sessions", transport="sse") == 0


def read_to_end(sock: socket.socket) -> bytes:
    sock.settimeout(20)
    chunks = []
    while chunk := sock.recv(65_536):
        chunks.append(chunk)
    return b"".join(chunks)


# --- abandoned replies --------------------------------------------------------------------------

SLOW = {"text": "First words here. " + "Then more text, slowly. " * 30, "echo_tps": "4"}


async def leave_sse(base: str, method: str, params: dict[str, Any], after: str) -> None:
    """Open a reply and go away once an event named `after` has come."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        if method == "GET":
            request = http.build_request("GET", "/v1/speak/sse", params=params)
        else:
            request = http.build_request("POST", "/v1/speak", json=params)
        response = await http.send(request, stream=True)
        assert response.status_code == 200
        async for raw in response.aiter_raw():
            if after.encode() in raw:
                break
        await response.aclose()


@pytest.mark.parametrize(
    ("route", "mode"),
    [
        ("GET", "bidi"),
        ("GET", "batch"),
        ("POST", "bidi"),
        ("POST", "batch"),
        ("WS", "bidi"),
        ("WS", "batch"),
        ("openai-sse", "bidi"),
        ("openai-audio", "bidi"),
    ],
)
async def test_an_abandoned_reply_leaves_nothing_behind(
    own_fake_server: RunningServer, fake_engine: FakeEngine, route: str, mode: str
) -> None:
    """The listener goes away mid-reply, on every route and mode: the model-server session
    closes, and the gateway's session gauges and in-flight counts go back to 0."""
    # batch: the text is still arriving (nothing synthesized yet); bidi: audio is playing
    after = "text_delta" if mode == "batch" else "audio_chunk"
    params = {**SLOW, "format": "pcm", "mode": mode}
    with gateway(own_fake_server) as gw:
        if route in ("GET", "POST"):
            await leave_sse(gw.http_url, route, params, after)
        elif route == "WS":
            async with connect(gw.ws_url + "/v1/speak/ws") as ws:
                await ws.send(orjson.dumps({"type": "speak", **params}).decode())
                while True:
                    frame = await ws.recv()
                    kind = (
                        "audio_chunk" if isinstance(frame, bytes) else orjson.loads(frame)["type"]
                    )
                    if kind == after:
                        break
        else:  # no pacing here: the engine holds the first chunk until the reply is cancelled
            fake_engine.hold = True
            body = {"input": SLOW["text"], "response_format": "pcm"}
            if route == "openai-sse":
                body["stream_format"] = "sse"
            async with (
                httpx.AsyncClient(base_url=gw.http_url, timeout=30) as http,
                http.stream("POST", "/v1/audio/speech", json=body) as r,
            ):
                assert r.status_code == 200
                assert await asyncio.to_thread(fake_engine.entered.wait, 10)
            assert await asyncio.to_thread(fake_engine.cancel_seen.wait, 10)
        assert await asyncio.to_thread(wait_drained, own_fake_server.http_url, 20, 0.02) == 0
        assert await wait_for_metric(gw, "gateway_open_sessions", 0) == 0
        used = {"GET": ("sse",), "POST": ("sse",), "WS": ("ws", "ws_reply")}.get(route, ("openai",))
        for transport in used:  # counted while it ran (so the series is there), 0 now
            assert await metric(gw, "gateway_active_sessions", transport=transport) == 0


# --- logs, internal listener --------------------------------------------------------------------


async def test_access_logs_carry_no_query_or_body(
    gateway_on_fake: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gateway.access.policy")
    secret = "my card number is 4242"
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, timeout=15) as http:
        async with http.stream("GET", "/v1/speak/sse", params={**HI, "text": secret}) as r:
            await read_sse(r)
        await http.post("/v1/speak", json={**HI, "text": secret})
    deadline = time.monotonic() + 20  # a request is logged once its handler has returned
    while len(lines := access_lines(caplog)) < 2 and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.05)
    assert any(line.startswith("GET /v1/speak/sse 200 ") for line in lines), lines
    assert any(line.startswith("POST /v1/speak 200 ") for line in lines), lines
    assert not [line for line in lines if "4242" in line or "card" in line]


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gateway.access.policy"]


async def test_metrics_and_details_only_on_the_internal_listener(
    gateway_on_fake: RunningServer,
) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as public:
        assert (await public.get("/metrics")).status_code == 404
        ready = await public.get("/readyz")
    assert ready.json() == {"status": "ready"}
    async with httpx.AsyncClient(base_url=gateway_on_fake.internal_url) as internal:
        metrics = await internal.get("/metrics")
        detail = await internal.get("/readyz")
        assert (await internal.get("/v1/voices")).status_code == 404
    assert "gateway_open_sessions" in metrics.text
    assert detail.json()["tts"] == gateway_on_fake.app.state.service.settings.model_server_url


async def test_a_lexicon_is_its_keys_and_a_token_may_only_speak_with_it(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    entries = {"entries": {"kokoro": "/kˈOkəɹO/"}}
    with gateway(fake_server, api_keys=KEYS) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            assert (await http.put("/v1/lexicons/names", json=entries)).status_code == 401
            saved = await http.put("/v1/lexicons/names", json=entries, headers=auth())
            assert saved.json() == {"name": "names", "version": 1, "entries": 1}
            token = (await http.post("/v1/tokens", json={}, headers=auth())).json()["token"]
            params = {"text": "Kokoro.", "lexicon": "names", "token": token}
            async with http.stream("GET", "/v1/speak/sse", params=params) as r:
                await read_sse(r)
            assert fake_engine.calls == ["kˈOkəɹO."]  # the key's visitor speaks with it
            for refused in (
                await http.put("/v1/lexicons/names", json=entries, headers=auth(token)),
                await http.get("/v1/lexicons", params={"token": token}),
                await http.delete("/v1/lexicons/names", headers=auth(token)),
            ):
                assert code_of(refused) == (403, "token_not_for_route")
            # another key neither sees nor speaks it
            other = (await http.get("/v1/lexicons", headers=auth(OTHER_KEY))).json()
            assert other == {"deployment": None, "lexicons": []}
            unknown = await http.post(
                "/v1/speak", json={"text": "Kokoro.", "lexicon": "names"}, headers=auth(OTHER_KEY)
            )
            assert code_of(unknown) == (400, "unknown_lexicon")
