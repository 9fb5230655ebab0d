"""What a WebSocket or a token holds, and for how long (issue #49, findings 1, 6 and 7): a client
that never reads gives its session back; client text waits in a bounded queue; a WebSocket
ends with its token, at its age limit and when idle, whatever junk it sends; tokens carry their
visitor (`subject`), who has sessions, rates and cancels of its own within its key's."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import orjson
import pytest
from starlette.websockets import WebSocketState
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.access.keys import Client, KeyRing
from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.routes import speak_ws
from gateway.service import GatewayService
from gateway.sources.base import FlushMark
from gateway.sources.client import ClientTextSource
from gateway.speak_ws.connection import SpeakConnection, _Running
from gateway.speak_ws.session import Action, FeedText
from tests.support.gateway_client import read_sse, wait_for_metric
from tests.support.servers import RunningServer, serve

KEY = "web-key-0123456789abcdef"
KEYS = f"web:{KEY}"
HI = {"text": "Hello there.", "format": "pcm"}
WEB = Client("web")


@contextlib.contextmanager
def gateway(fake_server: RunningServer, **settings: Any) -> Iterator[RunningServer]:
    settings.setdefault("admission", False)  # access rules, not capacity
    app = create_gateway(GatewaySettings(model_server_url=fake_server.http_url, **settings))
    with serve(app) as running:
        yield running


def auth(credential: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {credential}"}


def code_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def refused_upgrade(exc: pytest.ExceptionInfo[InvalidStatus]) -> tuple[int, str]:
    response = exc.value.response
    return response.status_code, orjson.loads(response.body)["error"]["code"]


async def mint(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    minted = await http.post("/v1/tokens", json=body, headers=auth())
    assert minted.status_code == 200, minted.text
    answer: dict[str, Any] = minted.json()
    return answer


def claims(token: str) -> dict[str, Any]:
    payload = token.split(".")[0]
    decoded: dict[str, Any] = orjson.loads(base64.urlsafe_b64decode(payload + "=" * 4))
    return decoded


async def frames_until_closed(ws: ClientConnection) -> tuple[list[dict[str, Any]], int, str]:
    """The JSON frames up to the server's close, and that close's code and reason."""
    return await exchange_until_closed(ws, None)


async def exchange_until_closed(
    ws: ClientConnection, messages: list[str | bytes] | None
) -> tuple[list[dict[str, Any]], int, str]:
    """Send each of `messages` in turn, again and again, reading its answer (None: send
    nothing), until the server closes; the JSON frames read, and the close's code and reason.
    A send that finds the connection closed goes on reading: what the server said before it
    closed (its reason, as an error frame) may still wait to be read."""
    events = []
    try:
        for n in range(10**9):
            if messages:
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(messages[n % len(messages)])
            frame = await ws.recv()
            if isinstance(frame, str):
                events.append(orjson.loads(frame))
    except ConnectionClosed as exc:
        received = exc.rcvd
    else:
        raise AssertionError("never closed")
    assert received is not None, "the server did not close"
    return events, received.code, received.reason


# --- 1. a client that never reads ---------------------------------------------------------------


class NeverReads:
    """The part of Starlette's WebSocket the speak route uses, for a client that sends and never
    reads: text frames go out (its buffers have room for those), an audio frame never does."""

    def __init__(self, service: GatewayService, client: Client) -> None:
        self.app = SimpleNamespace(state=SimpleNamespace(service=service))
        self.scope: dict[str, Any] = {"state": {"client": client}}
        self.query_params: dict[str, str] = {}  # protocol 1
        self.application_state = WebSocketState.CONNECTED
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[dict[str, Any]] = []
        self.gave_up = asyncio.Event()  # the gateway stopped waiting to send an audio frame
        self.closed: tuple[int, str | None] | None = None

    def client_sends(self, message: dict[str, Any]) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": orjson.dumps(message)})

    async def accept(self) -> None:
        pass

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send_text(self, data: str) -> None:
        self.sent.append(orjson.loads(data))

    async def send_bytes(self, data: bytes) -> None:
        try:
            await asyncio.Event().wait()  # the socket's buffers are full, for good
        finally:
            self.gave_up.set()

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        self.closed = (code, reason)
        self.application_state = WebSocketState.DISCONNECTED


@contextlib.asynccontextmanager
async def service_on(fake_server: RunningServer, **settings: Any) -> AsyncIterator[GatewayService]:
    config = GatewaySettings(model_server_url=fake_server.http_url, admission=False, **settings)
    service = GatewayService(config)
    await service.start()
    try:
        yield service
    finally:
        await service.aclose()


def open_sessions(service: GatewayService) -> float | None:
    return service.metrics.registry.get_sample_value("gateway_open_sessions")


async def test_a_client_that_never_reads_gives_its_session_back(
    fake_server: RunningServer,
) -> None:
    """The attack of finding 1, on the route itself: `speak` without text, one `text`, then
    no reading and ~300 empty deltas. The reply's audio frame times out; the reply ends, its
    client text is closed and the connection, its session with it, is given back, however
    many deltas follow (the receive loop never waits on a queue nobody reads)."""
    settings = {"send_timeout_s": 0.2, "chunk_plan": "sentences"}
    async with service_on(fake_server, **settings) as service:
        assert open_sessions(service) == 0
        ws = NeverReads(service, WEB)
        ws.client_sends({"type": "speak", "format": "pcm"})
        ws.client_sends({"type": "text", "delta": "Hello there. This is a second sentence. "})
        route = asyncio.create_task(speak_ws.speak_ws(ws))  # type: ignore[arg-type]
        await ws.gave_up.wait()  # the send timed out: the client is dropped
        for _ in range(300):
            ws.client_sends({"type": "text", "delta": ""})
        ws.incoming.put_nowait({"type": "websocket.disconnect", "code": 1006})
        async with asyncio.timeout(20):  # on 942863e the loop blocks on a full queue for good
            await route
        assert service.gate.sessions.total == 0
        assert open_sessions(service) == 0
        active = service.metrics.registry.get_sample_value(
            "gateway_active_sessions", {"transport": "ws"}
        )
        assert active == 0
        assert [e["type"] for e in ws.sent][:1] == ["agent_start"]
        assert ws.closed is None  # nothing more could be sent to it, not even a close


def test_client_text_waits_in_a_bounded_queue() -> None:
    source = ClientTextSource(max_pending=2)
    assert source.offer("one ")
    assert source.offer("two ")
    assert not source.offer("three ")  # full: refused, never waited for
    source.end()  # the end always fits
    assert source.ended
    assert not source.closed
    dropped = ClientTextSource(max_pending=2)
    assert dropped.offer("lost ")
    dropped.close()  # its reply is gone: what waits is forgotten, a reader ends
    assert dropped.closed

    async def read(s: ClientTextSource) -> list[str | FlushMark]:
        return [d async for d in s.stream()]

    assert asyncio.run(read(source)) == ["one ", "two "]
    assert asyncio.run(read(dropped)) == []


async def test_client_text_past_its_queue_is_text_queue_full(fake_server: RunningServer) -> None:
    """A delta that finds the utterance's text queue full is refused with an error frame at
    once (on 942863e the receive loop waited for room)."""
    async with service_on(fake_server) as service:
        ws = NeverReads(service, WEB)
        connection = SpeakConnection(ws, service, WEB, await service.gate.open_session(WEB))  # type: ignore[arg-type]
        source = ClientTextSource(max_pending=2)
        connection._running["u1"] = _Running("u1", client_text=source)
        async with asyncio.timeout(10):
            feeds: list[Action] = [FeedText(t, "u1") for t in ("one ", "two ", "three ")]
            await connection._apply(feeds)
        assert [(e["type"], e["code"], e["status"]) for e in ws.sent] == [
            ("error", "text_queue_full", 429)
        ]
        assert ws.sent[0]["retryable"] is True
        source.end()
        assert [d async for d in source.stream()] == ["one ", "two "]
        errors = service.metrics.registry.get_sample_value(
            "gateway_errors_total", {"code": "text_queue_full"}
        )
        assert errors == 1
        connection.lease.release()


# --- 6. a WebSocket's lifetime ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/speak/ws", "/ws"])
async def test_a_websocket_closes_when_its_token_expires(
    fake_server: RunningServer, path: str
) -> None:
    with gateway(fake_server, api_keys=KEYS, token_ttl_s=120, idle_timeout_s=10) as gw:
        routes = ["agentcore"] if path == "/ws" else ["speak"]
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            token = (await mint(http, routes=routes))["token"]
        # the gateway's clock moved on: the token has two or three seconds left when it connects
        gw.app.state.service.wall_clock = lambda: time.time() + 117
        async with connect(f"{gw.ws_url}{path}?token={token}") as ws:
            _, events = await speak_once(ws)
            assert events[-1]["type"] == "agent_end"
            events, code, reason = await frames_until_closed(ws)
        assert (code, reason) == (1008, "token_expired")
        assert [(e["type"], e["code"], e["status"]) for e in events] == [
            ("error", "token_expired", 401)
        ]
        assert await wait_for_metric(gw, "gateway_open_sessions", 0) == 0


async def speak_once(ws: ClientConnection) -> tuple[bytes, list[dict[str, Any]]]:
    await ws.send(orjson.dumps({"type": "speak", **HI}).decode())
    audio, events = b"", []
    while True:
        frame = await ws.recv()
        if isinstance(frame, bytes):
            audio += frame
            continue
        events.append(orjson.loads(frame))
        if events[-1]["type"] == "agent_end":
            return audio, events


async def test_a_websocket_closes_at_its_age_limit_whatever_its_credentials(
    fake_server: RunningServer,
) -> None:
    """Opened with the key itself (no token to expire) and busy with well-formed messages: it
    still closes once it is `--max-connection-age-s` old."""
    with gateway(fake_server, api_keys=KEYS, max_connection_age_s=0.5, idle_timeout_s=10) as gw:
        async with connect(gw.ws_url + "/v1/speak/ws", additional_headers=auth()) as ws:
            # well formed: activity (on 942863e there is no such setting)
            events, code, reason = await exchange_until_closed(ws, ['{"type": "cancel"}'])
        assert (code, reason) == (1008, "max_connection_age")
        answers = [e["code"] for e in events]
        assert answers[-1] == "max_connection_age"
        assert set(answers[:-1]) <= {"nothing_to_cancel"}


async def test_only_well_formed_messages_keep_a_websocket_open(
    own_fake_server: RunningServer,
) -> None:
    """Junk (invalid JSON, binary frames, unknown types) is answered, and keeps nothing open:
    the connection is closed as idle all the same."""
    junk: list[str | bytes] = ["{not json", b"\x00\x01", '{"type": "nonsense"}']
    with gateway(own_fake_server, idle_timeout_s=0.5) as gw:
        async with connect(gw.ws_url + "/v1/speak/ws") as ws:
            async with asyncio.timeout(15):  # on 942863e junk kept it open for good
                events, code, _ = await exchange_until_closed(ws, junk)
        assert code == 1000
        answers = [e["code"] for e in events]
        assert answers[-1] == "idle_timeout"
        assert set(answers[:-1]) <= {"invalid_json", "binary_frame", "unknown_type"}


# --- 7. tokens carry their own subject ----------------------------------------------------------


async def test_a_token_carries_its_subject(fake_server: RunningServer) -> None:
    with gateway(fake_server, api_keys=KEYS) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            named = await mint(http, subject="visitor-42@example.com")
            assert named["subject"] == "visitor-42@example.com"
            assert claims(named["token"])["subject"] == "visitor-42@example.com"
            first, second = await mint(http), await mint(http)
            assert first["subject"] != second["subject"]  # random, each its own
            assert claims(first["token"])["subject"] == first["subject"]
            for bad in ["", "a b", "x" * 65, "tab\there", "ünïcode", 42, None]:
                refused = await http.post("/v1/tokens", json={"subject": bad}, headers=auth())
                if bad is None:  # null: the same as none given
                    assert refused.status_code == 200
                    continue
                assert code_of(refused) == (400, "invalid_field"), bad
            # a token minted before subjects still verifies, counted under its key
            old = KeyRing.parse(KEYS.split(",")).mint(WEB, time.time(), 120)
            assert "subject" not in claims(old)
            assert (await http.get("/v1/voices", params={"token": old})).status_code == 200
    ring = KeyRing.parse(KEYS.split(","))
    now = time.time()
    assert ring.by_token(old, now).subject is None
    held = ring.by_token(ring.mint(WEB, now, 60, subject="v1"), now)
    assert (held.name, held.subject, held.holder) == ("web", "v1", "web v1")
    assert held.expires == int(now) + 60
    with pytest.raises(ValueError, match="subject"):
        ring.mint(WEB, now, 60, subject="not valid")


async def test_sessions_and_replies_count_per_subject(fake_server: RunningServer) -> None:
    """Visitor A cannot take the key's whole share: past its own two sessions (or its reply
    a minute) A is refused while B, with a token of the same key, is served; the key's own
    caps still hold over all its visitors."""
    settings = {
        "api_keys": KEYS,
        "max_sessions_per_subject": 2,
        "replies_per_minute_per_subject": 1,
        "replies_per_minute": 3,
    }
    with gateway(fake_server, **settings) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            a = (await mint(http, subject="visitor-a"))["token"]
            b = (await mint(http, subject="visitor-b"))["token"]
            c = (await mint(http, subject="visitor-c"))["token"]
            d = (await mint(http, subject="visitor-d"))["token"]
            url = gw.ws_url + "/v1/speak/ws?token="
            async with contextlib.AsyncExitStack() as stack:
                for _ in range(2):
                    await stack.enter_async_context(connect(url + a))
                with pytest.raises(InvalidStatus) as third:
                    async with connect(url + a):
                        pass
                assert refused_upgrade(third) == (429, "too_many_sessions")
                assert "subject" in orjson.loads(third.value.response.body)["error"]["message"]
                async with connect(url + b) as ws:  # another visitor of the same key
                    await ws.send('{"type": "cancel"}')
                    assert orjson.loads(await ws.recv())["code"] == "nothing_to_cancel"
            assert await wait_for_metric(gw, "gateway_open_sessions", 0) == 0

            async def speak(token: str) -> httpx.Response:
                async with http.stream("POST", "/v1/speak", json=HI, headers=auth(token)) as r:
                    await r.aread()
                    return r

            assert (await speak(a)).status_code == 200
            again = await speak(a)
            assert code_of(again) == (429, "rate_limited")
            assert "per token subject" in again.json()["error"]["message"]
            assert (await speak(b)).status_code == 200  # B has its own minute
            assert (await speak(c)).status_code == 200  # the key's third reply
            key_cap = await speak(d)  # D's first, but the key's fourth
            assert code_of(key_cap) == (429, "rate_limited")
            assert "per client" in key_cap.json()["error"]["message"]


async def test_only_the_subject_that_started_a_reply_may_cancel_it(
    fake_server: RunningServer,
) -> None:
    """B, with another token of the same key, cannot stop A's reply, nor learn that it plays
    (404 as for any id); the key itself may."""
    with gateway(fake_server, api_keys=KEYS) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=30) as http:
            a = (await mint(http, subject="visitor-a"))["token"]
            b = (await mint(http, subject="visitor-b"))["token"]
            slow = {**HI, "text": "Word " * 60, "echo_tps": 5, "utterance_id": "order-1"}
            async with http.stream("POST", "/v1/speak", json=slow, headers=auth(a)) as r:
                assert r.status_code == 200
                assert r.headers["x-utterance-id"] == "order-1"
                lines = r.aiter_lines()
                async for line in lines:  # A's reply is registered once its stream is open
                    if line.startswith("event: agent_start"):
                        break
                cancel = "/v1/speak/order-1/cancel"
                by_b = await http.post(cancel, json={}, headers=auth(b))
                assert code_of(by_b) == (404, "unknown_utterance")
                # B may use the same id for a reply of its own meanwhile
                mine = {**HI, "utterance_id": "order-1"}
                async with http.stream("POST", "/v1/speak", json=mine, headers=auth(b)) as own:
                    assert own.status_code == 200
                    assert (await read_sse(own)).names[-1] == "agent_end"
                by_key = await http.post(cancel, json={}, headers=auth())
                assert by_key.status_code == 200, by_key.text
                assert by_key.json()["utterance_id"] == "order-1"
                rest = [line async for line in lines]
            assert "event: cancelled" in rest
            assert "event: agent_end" not in rest
