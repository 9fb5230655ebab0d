"""Credentials and conversations across callers (issue #49, findings 3 and 4): each outbound
client carries only its own credentials (the LLM never sees the model servers' key); AgentCore
conversations belong to a caller and a session, within `--max-history-chars`; what a reply
sends its LLM counts against the per-minute token limit beside its answer, on every route that
prompts."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI, Request, Response
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from tests.support.fakes import FakeEngine, serve_fake
from tests.support.gateway_client import read_reply, ws_reply_audio
from tests.support.openai_stub import create_stub, llm_gateway_settings
from tests.support.servers import RunningServer, serve

MODEL_KEY = "model-key-0123456789abcdef"
LLM_KEY = "llm-key-fedcba9876543210"
ALICE = "alice-key-0123456789abcdef"
BOB = "bob-key-0123456789abcdef01"
KEYS = f"alice:{ALICE},bob:{BOB}"
SESSION = "agentcore-session-0123456789abcdef-1"  # 36 characters
HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
ANSWER = ["Sure", ", here", " it", " is."]


def recording_llm() -> FastAPI:
    """The OpenAI-style stand-in, keeping each request's headers beside its body."""
    app = create_stub(ANSWER)
    app.state.headers = []

    @app.middleware("http")
    async def record(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Any:
        app.state.headers.append(dict(request.headers))
        return await call_next(request)

    return app


def code_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def refused_upgrade(exc: pytest.ExceptionInfo[InvalidStatus]) -> tuple[int, str]:
    response = exc.value.response
    return response.status_code, orjson.loads(response.body)["error"]["code"]


def turns(request: dict[str, Any]) -> list[tuple[str, str]]:
    """A chat request's messages but the system prompt, as (role, content)."""
    return [(m["role"], m["content"]) for m in request["messages"] if m["role"] != "system"]


async def invoke(
    base: str, body: dict[str, Any], key: str | None = None, session: str | None = SESSION
) -> httpx.Response:
    headers = {} if session is None else {HEADER: session}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        return await http.post("/invocations", json=body, headers=headers)


# --- finding 3: the model servers' key goes to the model servers only ----------------------


async def test_the_llm_gets_its_own_key_or_none_never_the_model_servers(
    fake_engine: FakeEngine,
) -> None:
    for llm_key in ("", LLM_KEY):  # the documented Ollama/vLLM set-up has none
        with (
            serve_fake(fake_engine, api_key=MODEL_KEY) as model_server,
            serve(recording_llm()) as llm,
        ):
            settings = llm_gateway_settings(
                model_server.http_url,
                llm.http_url,
                model_server_key=MODEL_KEY,
                openai_api_key=llm_key,
            )
            with serve(create_gateway(settings)) as gw:
                async with httpx.AsyncClient(base_url=gw.http_url, timeout=30) as http:
                    # the model server (which refuses calls without its key) still serves:
                    # /load, /voices, its WebSocket and POST /invocations carry the key
                    assert (await http.get("/readyz")).json()["status"] == "ready"
                    voices = (await http.get("/v1/voices")).json()
                    assert "af_test" in {v["name"] for v in voices["voices"]}
                    for mode in ("bidi", "batch"):
                        body = {"prompt": "Hello?", "mode": mode, "format": "pcm"}
                        async with http.stream("POST", "/v1/speak", json=body) as response:
                            reply = await read_reply(response)
                        assert "error" not in reply.names
                        assert b"".join(reply.audio_chunks())
            recorded = llm.app.state.headers
        assert len(recorded) == 2
        for headers in recorded:
            assert MODEL_KEY not in orjson.dumps(headers).decode()
            if llm_key:
                assert headers["authorization"] == f"Bearer {llm_key}"
            else:
                assert "authorization" not in headers


# --- finding 4: AgentCore conversations are a caller's; prompts are metered ----------------


async def test_another_key_with_the_same_session_header_gets_a_conversation_of_its_own(
    fake_server: RunningServer,
) -> None:
    with serve(create_stub(ANSWER)) as llm:
        settings = llm_gateway_settings(fake_server.http_url, llm.http_url, api_keys=KEYS)
        with serve(create_gateway(settings)) as gw:
            secret = "Remember this: my card PIN is 4321."
            for key, prompt in [(ALICE, secret), (BOB, "What did I tell you?"), (ALICE, "And?")]:
                response = await invoke(gw.http_url, {"prompt": prompt}, key)
                assert response.status_code == 200
                assert '"type":"agent_end"' in response.text
        alice, bob, alice_again = llm.app.state.requests
    answer = "".join(ANSWER)
    assert turns(alice) == [("user", secret)]
    assert "4321" not in orjson.dumps(bob["messages"]).decode()
    assert turns(bob) == [("user", "What did I tell you?")]  # a fresh conversation
    # Bob's turn went to his own conversation, not into Alice's
    assert turns(alice_again) == [("user", secret), ("assistant", answer), ("user", "And?")]


async def test_two_visitors_of_one_key_have_conversations_of_their_own(
    fake_server: RunningServer,
) -> None:
    """Tokens of one key for two visitors (their subjects), the same session header."""
    with serve(create_stub(ANSWER)) as llm:
        settings = llm_gateway_settings(fake_server.http_url, llm.http_url, api_keys=KEYS)
        with serve(create_gateway(settings)) as gw:
            tokens = []
            async with httpx.AsyncClient(base_url=gw.http_url) as http:
                for visitor in ("visitor-a", "visitor-b"):
                    minted = await http.post(
                        "/v1/tokens",
                        json={"routes": ["agentcore"], "subject": visitor},
                        headers={"Authorization": f"Bearer {ALICE}"},
                    )
                    assert minted.status_code == 200, minted.text
                    tokens.append(minted.json()["token"])
            first, second = tokens
            for token, prompt in [(first, "My PIN is 4321."), (second, "What is my PIN?")]:
                response = await invoke(gw.http_url, {"prompt": prompt}, token)
                assert '"type":"agent_end"' in response.text
        _, other = llm.app.state.requests
    assert turns(other) == [("user", "What is my PIN?")]


async def test_an_agentcore_conversation_keeps_within_max_history_chars(
    fake_server: RunningServer,
) -> None:
    with serve(create_stub(ANSWER)) as llm:
        settings = llm_gateway_settings(
            fake_server.http_url, llm.http_url, llm_tokens_per_minute=0, max_history_chars=8_000
        )
        with serve(create_gateway(settings)) as gw:
            for i in range(11):
                prompt = f"{i:02d} " + "x" * 4_997  # 5,000 characters, the longest prompt
                response = await invoke(gw.http_url, {"prompt": prompt})
                assert response.status_code == 200
                assert '"type":"agent_end"' in response.text
        requests = llm.app.state.requests
    assert len(requests) == 11
    for i, request in enumerate(requests):
        *history, last = turns(request)
        assert last == ("user", f"{i:02d} " + "x" * 4_997)
        assert sum(len(content) for _, content in history) <= 8_000
    # the newest exchange is what is kept, the oldest went first
    assert turns(requests[-1])[0][1].startswith("09 ")


def _small_token_limit(model_server: str, llm: str) -> Any:
    # 1,000 tokens a minute; a 4,000-character prompt and the system prompt are more than that
    return llm_gateway_settings(model_server, llm, llm_tokens_per_minute=1_000)


LONG_PROMPT = "Tell me about this. " * 200  # 4,000 characters


@pytest.mark.parametrize("route", ["sse", "agentcore"])
async def test_prompt_tokens_count_against_the_token_limit(
    fake_server: RunningServer, route: str
) -> None:
    with serve(create_stub(ANSWER)) as llm:
        settings = _small_token_limit(fake_server.http_url, llm.http_url)
        with serve(create_gateway(settings)) as gw:
            async with httpx.AsyncClient(base_url=gw.http_url, timeout=30) as http:
                path = "/v1/speak" if route == "sse" else "/invocations"
                body = {"prompt": LONG_PROMPT, "format": "pcm"}
                first = await http.post(path, json=body)
                assert first.status_code == 200
                assert "agent_end" in first.text
                # the answer alone is 5 tokens: the prompt sent is what used the minute
                second = await http.post(path, json={"prompt": "And?", "format": "pcm"})
        assert len(llm.app.state.requests) == 1
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "rate_limited"


async def test_prompt_tokens_count_on_the_websocket(fake_server: RunningServer) -> None:
    with serve(create_stub(ANSWER)) as llm:
        settings = _small_token_limit(fake_server.http_url, llm.http_url)
        with serve(create_gateway(settings)) as gw:
            async with connect(gw.ws_url + "/v1/speak/ws") as ws:
                speak = {"type": "speak", "prompt": LONG_PROMPT, "format": "pcm"}
                await ws.send(orjson.dumps(speak).decode())
                await ws_reply_audio(ws)
                await ws.send(orjson.dumps({**speak, "prompt": "And?"}).decode())
                refused = orjson.loads(await ws.recv())
        assert len(llm.app.state.requests) == 1
    assert (refused["type"], refused.get("code")) == ("error", "rate_limited")


# --- what held, and must keep holding (issue #49's list; the rest is covered elsewhere) ----


@contextlib.contextmanager
def keyed_gateway(fake_server: RunningServer, **settings: Any) -> Iterator[RunningServer]:
    settings.setdefault("admission", False)  # the access rules here, not capacity
    app = create_gateway(
        GatewaySettings(model_server_url=fake_server.http_url, api_keys=KEYS, **settings)
    )
    with serve(app) as running:
        yield running


HI = {"text": "Hello there.", "format": "pcm"}
# every protected HTTP route, with a body its own checks would take
HTTP_ROUTES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/speak", HI),
    ("GET", "/v1/speak/sse", None),
    ("POST", "/v1/speak/order-1/cancel", {}),
    ("POST", "/v1/audio/speech", {"input": "Hi."}),
    ("GET", "/v1/voices", None),
    ("POST", "/v1/tokens", {}),
    ("POST", "/invocations", HI),
]
UPGRADES = ["/v1/speak/ws", "/ws"]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


async def test_credentials_on_every_route_and_both_upgrades(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    """No key, a wrong key, forged, unsigned and expired tokens, a token for other routes, an
    API key in `?token=`, a token minting tokens: refused on every route and both upgrades,
    before anything runs."""
    with keyed_gateway(fake_server, token_ttl_s=60) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            mint = await http.post(
                "/v1/tokens",
                json={"routes": ["voices"]},
                headers={"Authorization": f"Bearer {ALICE}"},
            )
            voices_token = mint.json()["token"]
            mint = await http.post(
                "/v1/tokens",
                json={"routes": ["speak"]},
                headers={"Authorization": f"Bearer {ALICE}"},
            )
            speak_token = mint.json()["token"]
            payload, signature = voices_token.split(".")
            claims = orjson.loads(base64.urlsafe_b64decode(payload + "=="))
            everything = {**claims, "routes": ["speak", "speech", "voices", "agentcore"]}
            forged = [
                _b64(orjson.dumps(everything)) + "." + signature,  # claims changed under it
                payload + "." + _b64(bytes(32)),  # a signature of the right size, not its own
            ]
            unsigned = [payload, payload + ".", _b64(orjson.dumps(everything))]
            refusals: list[tuple[str, dict[str, str], dict[str, str], tuple[int, str]]] = [
                ("no credentials", {}, {}, (401, "unauthorized")),
                ("a wrong key", {"Authorization": "Bearer " + "w" * 26}, {}, (401, "unauthorized")),
                ("a key in ?token=", {}, {"token": ALICE}, (401, "unauthorized")),
                *[("forged", {}, {"token": t}, (401, "unauthorized")) for t in forged],
                *[("unsigned", {}, {"token": t}, (401, "unauthorized")) for t in unsigned],
                *[
                    ("forged", {"Authorization": f"Bearer {t}"}, {}, (401, "unauthorized"))
                    for t in forged
                ],
            ]
            for method, path, body in HTTP_ROUTES:
                for what, headers, query, expected in refusals:
                    r = await http.request(method, path, json=body, headers=headers, params=query)
                    assert code_of(r) == expected, (path, what)
                # a token for other routes; a token cannot mint tokens
                other = speak_token if path == "/v1/voices" else voices_token
                sent = {"Authorization": f"Bearer {other}"}
                r = await http.request(method, path, json=body, headers=sent)
                assert code_of(r) == (403, "token_not_for_route"), path
        assert fake_engine.calls == []  # nothing was spoken for any of them
        for path in UPGRADES:
            attempts: list[tuple[str, dict[str, str], tuple[int, str]]] = [
                ("", {}, (401, "unauthorized")),
                ("", {"Authorization": "Bearer " + "w" * 26}, (401, "unauthorized")),
                (f"?token={ALICE}", {}, (401, "unauthorized")),
                *[(f"?token={t}", {}, (401, "unauthorized")) for t in forged + unsigned],
                (f"?token={voices_token}", {}, (403, "token_not_for_route")),
            ]
            if path == "/ws":  # a speak token is not an AgentCore token
                attempts.append((f"?token={speak_token}", {}, (403, "token_not_for_route")))
            for suffix, sent, expected in attempts:
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(gw.ws_url + path + suffix, additional_headers=sent):
                        pass
                assert refused_upgrade(refused) == expected, (path, suffix, sent)
        # expired: the same tokens, later than their lifetime
        gw.app.state.service.wall_clock = lambda: time.time() + 61
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            late = await http.get("/v1/voices", params={"token": voices_token})
            assert code_of(late) == (401, "unauthorized")
            assert late.json()["error"]["message"] == "token expired"
            late = await http.post(
                "/v1/speak", json=HI, headers={"Authorization": f"Bearer {speak_token}"}
            )
            assert code_of(late) == (401, "unauthorized")
        with pytest.raises(InvalidStatus) as expired:
            async with connect(f"{gw.ws_url}/v1/speak/ws?token={speak_token}"):
                pass
        assert refused_upgrade(expired) == (401, "unauthorized")
        gw.app.state.service.wall_clock = time.time
        # and the right credentials are let in on the same routes (so the refusals were theirs)
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            assert (await http.get("/v1/voices", params={"token": voices_token})).status_code == 200
            keyed = await http.post(
                "/v1/tokens", json={}, headers={"Authorization": f"Bearer {BOB}"}
            )
            assert keyed.status_code == 200
        async with connect(f"{gw.ws_url}/v1/speak/ws?token={speak_token}") as ws:
            await ws.send(orjson.dumps({"type": "speak", **HI}).decode())
            audio, _ = await ws_reply_audio(ws)
        assert audio


async def test_origins_and_hosts_on_every_route_and_both_upgrades(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    """Evil, `null` and look-alike origins, a cross-site request without one; evil, trailing-dot
    and empty Host names: refused on the HTTP routes and both upgrades, with a good key."""
    with keyed_gateway(fake_server, allowed_origins="https://app.example") as gw:
        own = f"http://127.0.0.1:{gw.port}"
        origins = [
            "https://evil.example",
            "null",
            "https://app.example.evil.example",
            "https://evilapp.example",
            "https://app.example:8443",
            "http://app.example",
            f"{own}.evil.example",
            "http://localhost.evil.example",
            "http://127.0.0.1.evil.example:3000",
        ]
        key = {"Authorization": f"Bearer {ALICE}"}
        hosts = ["evil.example", "localhost.", "127.0.0.1.", f"127.0.0.1.:{gw.port}"]
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            for method, path, body in HTTP_ROUTES:
                for origin in origins:
                    r = await http.request(
                        method, path, json=body, headers={**key, "Origin": origin}
                    )
                    assert code_of(r) == (403, "origin_not_allowed"), (path, origin)
                for site in ("cross-site", "same-site"):  # an <img>, a <script>: no Origin
                    headers = {**key, "Sec-Fetch-Site": site}
                    r = await http.request(method, path, json=body, headers=headers)
                    assert code_of(r) == (403, "origin_not_allowed"), (path, site)
                for host in hosts:
                    r = await http.request(method, path, json=body, headers={**key, "Host": host})
                    assert code_of(r) == (400, "host_not_allowed"), (path, host)
            for host in hosts:
                assert code_of(await http.get("/", headers={"Host": host})) == (
                    400,
                    "host_not_allowed",
                )
            # the allowed origin and the page's own are let in
            for origin in ("https://app.example", own):
                ok = await http.get("/v1/voices", headers={**key, "Origin": origin})
                assert ok.status_code == 200, origin
        for path in ("/", "/v1/voices"):  # an empty Host, as raw HTTP/1.1
            head = await asyncio.to_thread(
                raw_request, gw.port, f"GET {path} HTTP/1.1\r\nHost:\r\n"
            )
            assert head.startswith(b"HTTP/1.1 400"), head[:100]
        assert fake_engine.calls == []
        for path in UPGRADES:
            for origin in origins:
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(gw.ws_url + path, origin=origin, additional_headers=key):  # type: ignore[arg-type]
                        pass
                assert refused_upgrade(refused) == (403, "origin_not_allowed"), (path, origin)
            with pytest.raises(InvalidStatus) as refused:
                async with connect(
                    gw.ws_url + path, additional_headers={**key, "Sec-Fetch-Site": "cross-site"}
                ):
                    pass
            assert refused_upgrade(refused) == (403, "origin_not_allowed"), path
            for host in hosts:
                with pytest.raises(InvalidStatus) as refused:
                    async with connect(gw.ws_url + path, additional_headers={**key, "Host": host}):
                        pass
                assert refused_upgrade(refused) == (400, "host_not_allowed"), (path, host)


def raw_request(port: int, head: str) -> bytes:
    """An HTTP/1.1 request as written (no client library tidying it); the answer's bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
        sock.sendall((head + "Connection: close\r\n\r\n").encode())
        return read_to_end(sock)


def read_to_end(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65_536):
        chunks.append(chunk)
    return b"".join(chunks)


async def test_static_files_stay_in_their_folder(gateway_on_fake: RunningServer) -> None:
    served = await asyncio.to_thread(
        raw_request, gateway_on_fake.port, "GET /static/speak.js HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    )
    assert served.startswith(b"HTTP/1.1 200")
    for path in (
        "/static/../config.py",
        "/static/../../pyproject.toml",
        "/static/%2e%2e/config.py",
        "/static/%2e%2e/%2e%2e/pyproject.toml",
        "/static/..%2fconfig.py",
        "/static/..%5cconfig.py",
        "/static/%252e%252e/config.py",
        "/static//etc/passwd",
        "/static/.%2e/.%2e/.%2e/.%2e/etc/passwd",
    ):
        answer = await asyncio.to_thread(
            raw_request, gateway_on_fake.port, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        )
        status = answer.split(b" ", 2)[1]
        assert status in (b"400", b"404"), (path, answer[:200])
        for leaked in (b"class Settings", b"[project]", b"root:"):
            assert leaked not in answer, path


# bodies no JSON parser should take: nested past any limit, not UTF-8, a lone surrogate, NaN
BAD_JSON = [
    b"[" * 60_000,
    b'{"text": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
    b'{"text": "Hi \xff\xfe there."}',
    b'{"text": "Hi \\ud800 there."}',
    b'{"text": "Hi.", "speed": NaN}',
    b'{"text": "Hi.", "speed": Infinity}',
]


async def test_bodies_no_parser_should_take_are_a_clean_400(
    gateway_on_fake: RunningServer,
) -> None:
    json = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, headers=json) as http:
        for path in ("/v1/speak", "/v1/audio/speech", "/invocations"):
            for body in BAD_JSON:
                r = await http.post(path, content=body)
                assert r.status_code == 400, (path, body[:40], r.text[:200])
                assert r.json()["error"]["code"] in ("invalid_json", "invalid_field"), body[:40]
                assert "Traceback" not in r.text
        # and the gateway is still well
        async with http.stream("POST", "/v1/speak", json=HI) as r:
            await read_reply(r)
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        for body in BAD_JSON:
            if b"\xff" in body:
                continue  # not text: a WebSocket text frame cannot carry it
            await ws.send(body.decode())
            error = orjson.loads(await ws.recv())
            assert (error["type"], error["code"]) == ("error", "invalid_json"), body[:40]
        await ws.send(orjson.dumps({"type": "speak", **HI}).decode())  # the session stays
        audio, _ = await ws_reply_audio(ws)
    assert audio


async def test_another_key_cannot_cancel_a_reply(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    fake_engine.hold = True  # the reply stays at the engine until the test lets it go
    with keyed_gateway(fake_server) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=30) as http:
            body = {**HI, "utterance_id": "order-1"}
            alice = {"Authorization": f"Bearer {ALICE}"}
            async with http.stream("POST", "/v1/speak", json=body, headers=alice) as reply:
                assert reply.status_code == 200
                assert await asyncio.to_thread(fake_engine.entered.wait, 10)  # playing
                bob = {"Authorization": f"Bearer {BOB}"}
                cancel = await http.post("/v1/speak/order-1/cancel", json={}, headers=bob)
                assert code_of(cancel) == (404, "unknown_utterance")
                fake_engine.gate.set()
                events = await read_reply(reply)
    assert "cancelled" not in events.names
    assert b"".join(events.audio_chunks())


async def test_idle_connections_are_freed_when_their_clients_close(
    fake_server: RunningServer,
) -> None:
    """200 connections that never send anything: once their clients close them, the gateway
    holds none of their descriptors."""
    with keyed_gateway(fake_server) as gw:
        sockets = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(200)]
        try:
            assert await until(lambda: len(accepted(gw.port)) == 200)
        finally:
            for sock in sockets:
                sock.close()
        assert await until(lambda: not accepted(gw.port)), len(accepted(gw.port))


def accepted(port: int) -> set[str]:
    """The connections the gateway (in this process) holds open on `port`: the inodes of this
    process's TCP sockets whose local port it is, not listening. (Counting all this process's
    descriptors instead raced other tests' servers closing theirs.)"""
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:["):
                ours.add(target[8:-1])
    held = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if int(local.rsplit(":", 1)[1], 16) == port and state != "0A" and inode in ours:
                    held.add(inode)
    return held


async def until(condition: Callable[[], bool], timeout_s: float = 20) -> bool:
    """Whether `condition` comes true within `timeout_s` (looked at every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)  # another thread's work: nothing here to wait on
    return True


@pytest.mark.slow
async def test_the_plugins_log_neither_keys_nor_tokens(
    fake_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Pipecat's service (loguru) and LiveKit's plugin (logging), at DEBUG, with a key, a
    token and a wrong key: no credential in any line, nor in the errors they raise."""
    from livekit.agents import APIConnectOptions, APIStatusError
    from livekit.agents.utils import http_context
    from livekit.plugins import kokoro_voice
    from loguru import logger
    from pipecat.frames.frames import ErrorFrame, TTSAudioRawFrame, TTSSpeakFrame
    from pipecat.tests.utils import run_test
    from pipecat_kokoro_voice import KokoroVoiceTTSService

    caplog.set_level(logging.DEBUG)
    lines: list[str] = []
    sink = logger.add(lambda message: lines.append(str(message)), level="DEBUG")
    wrong = "wrong-key-0123456789abcdef"
    try:
        with keyed_gateway(fake_server) as gw:
            async with httpx.AsyncClient(base_url=gw.http_url) as http:
                minted = await http.post(
                    "/v1/tokens", json={}, headers={"Authorization": f"Bearer {ALICE}"}
                )
            token = minted.json()["token"]
            for credential in (ALICE, token, wrong):
                pipecat = KokoroVoiceTTSService(url=gw.ws_url, api_key=credential)
                down, up = await run_test(
                    pipecat,
                    frames_to_send=[TTSSpeakFrame("With a key.")],
                    expected_down_frames=None,
                )
                spoken = b"".join(f.audio for f in down if isinstance(f, TTSAudioRawFrame))
                errors = [f.error for f in up if isinstance(f, ErrorFrame)]
                assert bool(spoken) == (credential != wrong)
                assert bool(errors) == (credential == wrong)
                lines += errors
            options = APIConnectOptions(max_retry=0)
            async with http_context.open():
                for credential in (ALICE, token, wrong):
                    async with kokoro_voice.TTS(base_url=gw.http_url, api_key=credential) as tts:
                        stream = tts.stream(conn_options=options)
                        if credential != wrong:
                            assert await livekit_frames(stream)
                            continue
                        with pytest.raises(APIStatusError) as refused:
                            await livekit_frames(stream)
                        assert refused.value.status_code == 401
                        lines.append(f"{refused.value!r} {refused.value} {refused.value.body}")
    finally:
        logger.remove(sink)
    # the plugins' own lines, and everything at INFO and above (the websockets library's own
    # DEBUG lines list a handshake's headers as sent: an application that turns them on logs
    # whatever Authorization header it sends)
    lines += [
        record.getMessage()
        for record in caplog.records
        if record.levelno >= logging.INFO or record.name.startswith("livekit")
    ]
    logged = "\n".join(lines)
    assert logged  # something was logged: the check below looked at the lines
    for secret in (ALICE, token, wrong, token.split(".")[0], token.split(".")[1]):
        assert secret not in logged


async def livekit_frames(stream: Any) -> list[Any]:
    async with stream:
        stream.push_text("Hello there.")
        stream.end_input()
        return [event async for event in stream]
