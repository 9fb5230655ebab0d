"""Two real gateways sharing one real `redis-server` (`--redis-url`), in front of one fake
model server, on loopback: a key's session cap and rate window hold across both, a killed
gateway's sessions come back by their TTL, and Redis going away and coming back is said out
loud (`degraded`, then rejoined) without a request hanging or a limit lost."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from tests.support.fakes import FakeEngine
from tests.support.gateway_client import metric, wait_for_metric
from tests.support.processes import gateway_process
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import RunningServer, free_port, serve

KEY = "web-key-0123456789abcdef"
WS = "/v1/speak/ws"
HI = {"text": "Hello there.", "format": "pcm"}
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture
def redis_db() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


# A store's deadline that a busy test machine does not pass by accident (a late answer counts
# as Redis gone: the shared limits would stop holding mid-test); the tests of a Redis that is
# gone give their own
PATIENT_S = 2.0


@contextlib.contextmanager
def gateway(server: RunningServer, redis_url: str, **settings: Any) -> Iterator[RunningServer]:
    options = {
        "api_keys": f"web:{KEY}",
        "admission": False,
        "redis_url": redis_url,
        "redis_timeout_s": PATIENT_S,
        **settings,
    }
    app = create_gateway(GatewaySettings(model_server_url=server.http_url, **options))
    with serve(app) as running:
        yield running


async def refused(url: str) -> tuple[int, str]:
    """The status and error code of a WebSocket upgrade the gateway refuses."""
    with pytest.raises(InvalidStatus) as refusal:
        async with connect(url + WS, additional_headers=AUTH):
            pass
    response = refusal.value.response
    return response.status_code, orjson.loads(response.body)["error"]["code"]


async def opened(stack: contextlib.AsyncExitStack, url: str) -> ClientConnection:
    return await stack.enter_async_context(connect(url + WS, additional_headers=AUTH))


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 30) -> None:
    """Polled: what another process or the clock decides has no event to wait on."""
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.05)


async def test_a_keys_session_cap_holds_across_two_gateways(
    fake_server: RunningServer, redis_db: RedisServer
) -> None:
    """Cap 3: two sockets on one gateway and one on the other, and the key's fourth is
    refused on both (each alone would have let it have 6); one closed, the other takes it."""
    settings = {"max_sessions_per_client": 3}
    with (
        gateway(fake_server, redis_db.url, **settings) as a,
        gateway(fake_server, redis_db.url, **settings) as b,
    ):
        async with contextlib.AsyncExitStack() as stack:
            first = await opened(stack, a.ws_url)
            await opened(stack, a.ws_url)
            await opened(stack, b.ws_url)
            assert await refused(a.ws_url) == (429, "too_many_sessions")
            assert await refused(b.ws_url) == (429, "too_many_sessions")
            await first.close()
            # its place, once a has given it back: a's store call follows the close, so b may
            # still refuse for a moment (as it would a real client, who retries after 5 s)
            sockets: list[ClientConnection] = []

            async def b_takes_it() -> bool:
                try:
                    sockets.append(await opened(stack, b.ws_url))
                except InvalidStatus as refusal:
                    if refusal.response.status_code != 429:
                        raise
                    return False
                return True

            await eventually(b_takes_it)
            socket = sockets[0]
            await socket.send(orjson.dumps({"type": "speak", **HI}).decode())
            assert [m async for m in _until_end(socket)][-1]["type"] == "agent_end"
        assert await metric(a, "gateway_fleet_up") == 1
        assert await metric(b, "gateway_fleet_round_trip_seconds_count") >= 2


async def _until_end(ws: ClientConnection) -> Any:
    async for message in ws:
        if isinstance(message, str):
            event = orjson.loads(message)
            yield event
            if event["type"] in ("agent_end", "error"):
                return


async def test_a_keys_replies_per_minute_hold_across_two_gateways(
    fake_server: RunningServer, redis_db: RedisServer
) -> None:
    with (
        gateway(fake_server, redis_db.url, replies_per_minute=3) as a,
        gateway(fake_server, redis_db.url, replies_per_minute=3) as b,
    ):
        async with httpx.AsyncClient(timeout=15, headers=AUTH) as http:
            for url in (a.http_url, b.http_url, a.http_url):
                reply = await http.post(url + "/v1/speak", json=HI)
                assert reply.status_code == 200
                assert b"agent_end" in reply.content
            for url in (b.http_url, a.http_url):
                limited = await http.post(url + "/v1/speak", json=HI)
                assert limited.status_code == 429
                error = limited.json()["error"]
                assert (error["code"], error["message"]) == (
                    "rate_limited",
                    "3 replies in the last minute, the limit per client is 3",
                )
                assert 55 <= int(limited.headers["Retry-After"]) <= 60


async def test_a_killed_gateways_sessions_come_back_by_their_ttl(
    fake_server: RunningServer, redis_db: RedisServer
) -> None:
    port = free_port()
    env = {"GATEWAY_REDIS_URL": redis_db.url, "GATEWAY_API_KEYS": f"web:{KEY}"}
    flags = ["--fleet-lease-ttl-s", "1", "--max-sessions-per-client", "2"]
    flags += ["--redis-timeout-s", str(PATIENT_S)]
    with (
        gateway(fake_server, redis_db.url, max_sessions_per_client=2) as survivor,
        gateway_process(port, fake_server.http_url, flags, env) as doomed,
    ):
        doomed_url = f"ws://127.0.0.1:{port}"
        async with contextlib.AsyncExitStack() as stack:
            await opened(stack, doomed_url)
            await opened(stack, doomed_url)
            assert await refused(survivor.ws_url) == (429, "too_many_sessions")
            os.kill(doomed.pid, signal.SIGKILL)  # no goodbye: its leases stay in Redis
            doomed.wait()

            async def served() -> bool:
                with contextlib.suppress(InvalidStatus):
                    async with connect(survivor.ws_url + WS, additional_headers=AUTH):
                        return True
                return False

            await eventually(served)  # within the TTL of its last renewal


async def test_redis_going_away_is_degraded_not_down_and_rejoins(
    fake_server: RunningServer, redis_db: RedisServer
) -> None:
    """Stopped: the gateway serves, counting alone (its cap still holds), the internal
    /readyz says degraded and why while the public one stays ready; started again (empty):
    rejoined, and the sessions opened meanwhile are counted in Redis."""
    settings = {"max_sessions_per_client": 2}  # a stopped Redis refuses at once
    with gateway(fake_server, redis_db.url, **settings) as gw:
        async with contextlib.AsyncExitStack() as stack, httpx.AsyncClient(timeout=15) as http:
            redis_db.stop()
            await opened(stack, gw.ws_url)  # the call that finds it gone: served all the same
            assert await wait_for_metric(gw, "gateway_fleet_up", 0) == 0
            await opened(stack, gw.ws_url)
            assert await refused(gw.ws_url) == (429, "too_many_sessions")  # its own count
            detail = (await http.get(gw.internal_url + "/readyz")).json()
            assert detail["status"] == "degraded"
            assert detail["fleet"] == {
                "state": "degraded",
                "reason": "Redis unreachable (ConnectionError)",
            }
            assert (await http.get(gw.http_url + "/readyz")).status_code == 200
            redis_db.start()
            assert await wait_for_metric(gw, "gateway_fleet_up", 1) == 1
            assert (await http.get(gw.internal_url + "/readyz")).json()["status"] == "ready"
            held = redis_db.client().zrange("{kokoro-gateway}:sessions:client:web", 0, -1)
            assert len(held) == 2
            changes = [
                await metric(gw, "gateway_fleet_state_changes_total", state=s)
                for s in ("down", "up")
            ]
            assert changes == [1, 1]


async def test_redis_required_refuses_while_it_is_away(
    fake_server: RunningServer, redis_db: RedisServer
) -> None:
    with gateway(fake_server, redis_db.url, redis_required=True) as gw:
        async with httpx.AsyncClient(timeout=15) as http:
            assert (await http.get(gw.http_url + "/readyz")).status_code == 200
            redis_db.stop()
            first = await http.post(gw.http_url + "/v1/speak", json=HI, headers=AUTH)
            assert first.status_code == 200  # the call that finds it gone, counted here
            assert await wait_for_metric(gw, "gateway_fleet_up", 0) == 0
            refusal = await http.post(gw.http_url + "/v1/speak", json=HI, headers=AUTH)
            assert refusal.status_code == 503
            assert refusal.json()["error"]["code"] == "fleet_unavailable"
            assert await refused(gw.ws_url) == (503, "fleet_unavailable")
            assert (await http.get(gw.http_url + "/readyz")).status_code == 503
            assert (await http.get(gw.internal_url + "/readyz")).json()["status"] == "not_ready"
            redis_db.start()
            assert await wait_for_metric(gw, "gateway_fleet_up", 1) == 1
            again = await http.post(gw.http_url + "/v1/speak", json=HI, headers=AUTH)
            assert again.status_code == 200


def test_a_bad_redis_url_is_one_line_and_exit_2() -> None:
    cli = [sys.executable, "-c", "from gateway.cli import main; main()"]
    env = {**os.environ, "GATEWAY_REDIS_URL": "http://user:s3cret@example.com"}
    done = subprocess.run(
        [*cli, "--port", str(free_port())], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "gateway: --redis-url is not a Redis URL (redis://[:password@]host:port/db, rediss:// "
        "for TLS, or unix:///path.sock)"
    ]


async def test_a_cancel_sent_to_the_other_gateway_stops_the_reply(
    fake_server: RunningServer, redis_db: RedisServer
) -> None:
    """A's SSE reply, cancelled through B (a barge-in's second connection landing on the
    other replica): B answers with what was heard, and A's stream ends `cancelled`. An id
    nobody plays, or one another key started, is 404 from B once both have said so."""
    keys = f"web:{KEY},app:app-key-0123456789abcdef"
    with (
        gateway(fake_server, redis_db.url, api_keys=keys) as a,
        gateway(fake_server, redis_db.url, api_keys=keys) as b,
    ):
        slow = {**HI, "text": "Word " * 60, "echo_tps": 5, "utterance_id": "order-1"}
        async with httpx.AsyncClient(timeout=30, headers=AUTH) as http:
            async with http.stream("POST", a.http_url + "/v1/speak", json=slow) as r:
                lines = r.aiter_lines()
                async for line in lines:  # the reply is registered once its stream is open
                    if line.startswith("event: agent_start"):
                        break
                cancel = b.http_url + "/v1/speak/order-1/cancel"
                other_key = {"Authorization": "Bearer app-key-0123456789abcdef"}
                by_other = await http.post(cancel, json={"played_ms": 0}, headers=other_key)
                assert by_other.status_code == 404
                assert by_other.json()["error"]["code"] == "unknown_utterance"
                stopped = await http.post(cancel, json={"played_ms": 0})
                assert stopped.status_code == 200, stopped.text
                assert stopped.json() == {
                    "utterance_id": "order-1",
                    "played_ms": 0,
                    "heard_text": "",
                }
                rest = [line async for line in lines]
            assert "event: cancelled" in rest
            assert "event: agent_end" not in rest
            unknown = await http.post(b.http_url + "/v1/speak/nobody/cancel", json={})
            assert unknown.status_code == 404


async def _spoken(http: httpx.AsyncClient, url: str, **body: Any) -> httpx.Response:
    """A whole reply through `url`'s SSE route (its body read to the end)."""
    return await http.post(url + "/v1/speak", json={**HI, **body}, headers=AUTH)


async def test_a_lexicon_saved_through_one_gateway_is_read_through_the_other(
    fake_server: RunningServer, fake_engine: FakeEngine, redis_db: RedisServer
) -> None:
    """Saved through a, listed and spoken through b; a new version through b is a's next
    reply's; deleted through a, b knows it no more. Saved while Redis is away, it is written
    back when Redis answers again (empty), and b reads it."""
    v1, v2 = {"entries": {"kokoro": "/kˈOkəɹO/"}}, {"entries": {"kokoro": "/kˈʌkʌɹʌ/"}}
    with (
        gateway(fake_server, redis_db.url) as a,
        gateway(fake_server, redis_db.url) as b,
    ):
        async with httpx.AsyncClient(timeout=15) as http:
            saved = await http.put(a.http_url + "/v1/lexicons/names", json=v1, headers=AUTH)
            assert saved.json() == {"name": "names", "version": 1, "entries": 1}
            listed = (await http.get(b.http_url + "/v1/lexicons", headers=AUTH)).json()
            assert listed["lexicons"] == [{"name": "names", "version": 1, "entries": 1}]
            await _spoken(http, b.http_url, text="Kokoro.", lexicon="names")
            assert fake_engine.calls == ["kˈOkəɹO."]
            again = await http.put(b.http_url + "/v1/lexicons/names", json=v2, headers=AUTH)
            assert again.json()["version"] == 2  # numbered once for the fleet
            await _spoken(http, a.http_url, text="Kokoro.", lexicon="names")
            assert fake_engine.calls[-1] == "kˈʌkʌɹʌ."
            gone = await http.delete(a.http_url + "/v1/lexicons/names", headers=AUTH)
            assert gone.status_code == 204
            unknown = await _spoken(http, b.http_url, text="Kokoro.", lexicon="names")
            assert unknown.json()["error"]["code"] == "unknown_lexicon"

            redis_db.stop()
            # the call that finds Redis gone degrades the store; saved here all the same
            meanwhile = await http.put(a.http_url + "/v1/lexicons/later", json=v1, headers=AUTH)
            assert meanwhile.status_code == 200
            assert await wait_for_metric(a, "gateway_fleet_up", 0) == 0
            redis_db.start()  # empty
            assert await wait_for_metric(a, "gateway_fleet_up", 1) == 1
            fake_engine.reset()
            await eventually(lambda: _has_lexicon(http, b.http_url, "later"), timeout_s=30)
            await _spoken(http, b.http_url, text="Kokoro.", lexicon="later")
            assert fake_engine.calls == ["kˈOkəɹO."]


async def _has_lexicon(http: httpx.AsyncClient, url: str, name: str) -> bool:
    listed = (await http.get(url + "/v1/lexicons", headers=AUTH)).json()
    return name in [lexicon["name"] for lexicon in listed["lexicons"]]


async def test_a_blend_saved_through_one_gateway_speaks_through_the_other(
    fake_server: RunningServer, fake_engine: FakeEngine, redis_db: RedisServer
) -> None:
    blend = {"name": "warm", "blend": "jf_alpha(1)+af_test(2)"}
    with (
        gateway(fake_server, redis_db.url) as a,
        gateway(fake_server, redis_db.url) as b,
    ):
        async with httpx.AsyncClient(timeout=15) as http:
            saved = await http.post(a.http_url + "/v1/voices", json=blend, headers=AUTH)
            assert saved.status_code == 201
            listed = (await http.get(b.http_url + "/v1/voices", headers=AUTH)).json()["blends"]
            assert listed == [{"name": "warm", "blend": "af_test(2)+jf_alpha(1)"}]
            await _spoken(http, b.http_url, voice="warm")
            assert fake_engine.voices_called == ["af_test(2)+jf_alpha(1)"]
            assert (
                await http.delete(b.http_url + "/v1/voices/warm", headers=AUTH)
            ).status_code == 204
            gone = await _spoken(http, a.http_url, voice="warm")
            assert gone.json()["error"]["code"] == "unknown_voice"
