"""What one client may hold of everyone's capacity, and what a request costs (issue #49,
findings 2 and 10): a reply waiting for its client's text holds no place on a model server, one
client's replies wait for spare time one at a time, the echo source's pacing only on loopback
or with `--echo-pacing`, a reply bounded by the speech its text makes (digits read out), a
strict Host parser, `voice: ""` the default voice and `speed: true` refused on every route.
Over the real gateway and pool, on loopback, in front of a fake model server."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from playwright.async_api import Browser
from websockets.asyncio.client import connect

from gateway.access.policy import LOOPBACK_HOSTS, AccessPolicy, Denial, RequestFacts, host_name
from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.routing import pool
from gateway.routing.admission import Refusal
from kokoro_contract.asks import Ask
from tests.end_to_end.test_browser import browser, open_demo, played_proof, speak, wait_for_state
from tests.support.gateway_client import model_server_pool, read_sse, sse_post, ws_events
from tests.support.servers import RunningServer, serve
from tests.support.steps import until

__all__ = ["browser"]  # the Chromium fixture, shared with tests/end_to_end/test_browser.py

HI = {"text": "Hello there.", "format": "pcm"}
WS = "/v1/speak/ws"
NUMBER = "123456789012345 "  # a 15-digit number, read in words: about 11 s of speech


@contextlib.contextmanager
def gateway(server: RunningServer, **settings: Any) -> Iterator[RunningServer]:
    app = create_gateway(GatewaySettings(model_server_url=server.http_url, **settings))
    with serve(app) as running:
        yield running


@contextlib.contextmanager
def beyond_loopback(server: RunningServer, **settings: Any) -> Iterator[RunningServer]:
    """A gateway configured as one that listens on every interface (served here on loopback,
    as the tests' servers are): anonymous and for the loopback names, said out loud."""
    with gateway(
        server, host="0.0.0.0", allow_anonymous=True, allowed_hosts="127.0.0.1", **settings
    ) as running:
        yield running


def error_codes(events: list[dict[str, Any]]) -> list[str]:
    return [e["code"] for e in events if e["type"] == "error"]


def code_of(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# --- 2: a reply waiting for its text holds nothing others need ------------------------------


async def test_a_websocket_reply_waiting_for_its_text_does_not_refuse_another(
    own_fake_server: RunningServer,
) -> None:
    """Alice's `speak` with no text, and no text after it, took the only place a 2-core model
    server has (a starting reply counts a typical reply's synthesis): Bob's reply was 503
    "replies in progress would fall behind". Now hers asks nothing, and Bob is served."""
    with gateway(own_fake_server) as gw:  # admission on; a server that has learned nothing
        async with connect(gw.ws_url + WS) as alice:
            await alice.send(orjson.dumps({"type": "speak", "format": "pcm"}).decode())
            assert orjson.loads(await alice.recv())["type"] == "agent_start"  # admitted
            bob = await sse_post(gw.http_url, HI)
            assert "error" not in bob.names
            assert sum(len(c) for c in bob.audio_chunks()) > 0
            # and Alice's reply, once its text comes, is served as before
            await alice.send(orjson.dumps({"type": "text", "delta": "Alice speaks now."}).decode())
            await alice.send('{"type": "flush"}')
            audio, events = await ws_events(alice)
            assert error_codes(events) == []
            assert len(audio) > 0


async def test_a_reply_counts_on_its_server_by_the_synthesis_it_asks_for(
    own_fake_server: RunningServer,
) -> None:
    async with model_server_pool(own_fake_server.http_url) as servers:
        alice = await servers.admit(budget_s=3.0)
        assert isinstance(alice, pool.PooledTransport)
        plan = ChunkPlan()
        alice.track(plan, waiting=lambda: not plan.asking)  # her client sends her text
        upstream = alice.upstream
        # no text yet: there, but asking for nothing
        assert (upstream.replies, upstream.asking(), upstream.asks(0.0)) == (1, [], ())
        assert await servers.pick(budget_s=3.0) is upstream
        plan.push("Hello there", 0.0)  # text: her first chunk is about to need the engine
        assert (upstream.asking(), upstream.asks(0.0)) == ([alice], (Ask(),))  # starting
        refused = await servers.pick(budget_s=3.0)
        assert isinstance(refused, Refusal)
        assert refused.reason.startswith("replies in progress would fall behind")
        # two words, and her client says nothing more past the first chunk's wait: too few
        # to cut, she waits for more text, and asks nothing again (nor wakes the plan)
        assert plan.tick(1.0) == []
        assert (plan.asking, plan.wake_at()) == (False, None)
        assert await servers.pick(budget_s=3.0) is upstream
        alice.release()
        assert upstream.replies == 0


def test_a_first_chunk_too_short_to_cut_waits_for_text_without_waking_the_plan() -> None:
    """Two words and nothing after: the plan's first wait passed, and it asked to be woken at
    that same moment again and again (a reply's loop spinning on a client that says nothing);
    now it waits for text, and cuts the first chunk as soon as the text allows."""
    plan = ChunkPlan()
    assert plan.push("Hi there", 0.0) == []
    assert plan.wake_at() == pytest.approx(0.6)
    assert plan.tick(0.6) == []
    assert plan.wake_at() is None
    assert not plan.asking
    chunks = plan.push(" my good friend", 2.0)  # enough words now: cut at once
    assert [c.text for c in chunks] == ["Hi there my good"]
    assert plan.asking


async def test_one_clients_replies_wait_for_spare_time_one_at_a_time(
    own_fake_server: RunningServer,
) -> None:
    """Spare time as it frees goes to the replies waiting, in arrival order: one client's
    second ask that would wait is refused at once, so another client's waits beside it."""
    async with model_server_pool(own_fake_server.http_url) as servers:
        running = await servers.admit(budget_s=3.0)  # starting: the next must wait
        assert isinstance(running, pool.PooledTransport)
        alice = asyncio.create_task(
            servers.admit(budget_s=3.0, wait_s=30.0, client="alice", per_client=1)
        )
        await until(lambda: servers.waiting == 1)
        again = await servers.admit(budget_s=3.0, wait_s=30.0, client="alice", per_client=1)
        assert isinstance(again, Refusal)
        assert (again.code, again.deferrable) == ("overloaded", False)
        assert "of this client's replies already wait" in again.reason
        bob = asyncio.create_task(
            servers.admit(budget_s=3.0, wait_s=30.0, client="bob", per_client=1)
        )
        await until(lambda: servers.waiting == 2)
        running.release()
        taken = await alice
        assert isinstance(taken, pool.PooledTransport)
        bob.cancel()
        with pytest.raises(asyncio.CancelledError):
            await bob
        assert servers.waiting == 0
        taken.release()


async def test_the_echo_sources_pacing_is_for_loopback_or_echo_pacing(
    fake_server: RunningServer,
) -> None:
    paced = {**HI, "echo_tps": 20, "echo_first_ms": 10_000}
    with beyond_loopback(fake_server, admission=False) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            refused = await http.post("/v1/speak", json=paced)
            assert code_of(refused) == (400, "echo_pacing_disabled")
            sse = await http.get("/v1/speak/sse", params={**HI, "echo_first_ms": "10000"})
            assert code_of(sse) == (400, "echo_pacing_disabled")
        async with connect(gw.ws_url + WS) as ws:
            await ws.send(orjson.dumps({"type": "speak", **paced}).decode())
            error = orjson.loads(await ws.recv())
            assert (error["type"], error["code"]) == ("error", "echo_pacing_disabled")
        reply = await sse_post(gw.http_url, HI)  # unpaced: spoken
        assert reply.names[-1] == "agent_end"
        assert "error" not in reply.names
    with beyond_loopback(fake_server, admission=False, echo_pacing=True) as gw:
        reply = await sse_post(gw.http_url, {**HI, "echo_tps": 200})
        assert "error" not in reply.names
    with gateway(fake_server, admission=False) as gw:  # loopback: always
        reply = await sse_post(gw.http_url, {**HI, "echo_tps": 200})
        assert "error" not in reply.names


# --- 10: cost bounded by what is spoken, and small inconsistencies ---------------------------


def test_digits_count_by_the_speech_they_make() -> None:
    """100 digits spoke 27.5 s with the real model, 100 characters of prose about 6.5 s."""
    from kokoro_contract.spoken import SpokenMeter, spoken_s  # (new with this estimate)

    prose = ("The quick brown fox jumps over the lazy dog. " * 3)[:100]
    assert spoken_s(prose) == pytest.approx(6.5)
    assert 25 <= spoken_s("7" * 100) <= 35
    assert spoken_s(NUMBER) > 10  # a 15-digit number in words
    assert spoken_s(prose, speed=2.0) == pytest.approx(spoken_s(prose) / 2)
    # a Japanese character by what it spoke: 144 of them 22.4-24.3 s with the real model
    japanese = "ご注文の品は昨日、ポートランドの倉庫から発送されました。"  # 28 characters
    assert spoken_s(japanese) == pytest.approx(28 * 2.5 * 0.065)
    # streamed: the same estimate fed 1, 2, 4 characters at a time
    text = f"Call 0800 {NUMBER}now, 50% off $5 & more. 2024-12-06."
    for size in (1, 2, 4):
        meter = SpokenMeter()
        for i in range(0, len(text), size):
            meter.push(text[i : i + size])
        assert meter.seconds == pytest.approx(spoken_s(text))


async def test_text_given_whole_that_speaks_too_long_is_refused_up_front(
    fake_server: RunningServer,
) -> None:
    digits = NUMBER * 20  # 320 characters, about 3.6 minutes of speech
    with gateway(fake_server, admission=False) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            for route, body in (
                ("/v1/speak", {**HI, "text": digits}),
                ("/v1/audio/speech", {"input": digits}),
            ):
                response = await http.post(route, json=body)
                assert code_of(response) == (400, "reply_too_long"), route
        async with connect(gw.ws_url + WS) as ws:
            await ws.send(orjson.dumps({"type": "speak", **HI, "text": digits}).decode())
            error = orjson.loads(await ws.recv())
            assert (error["type"], error["code"]) == ("error", "reply_too_long")
        reply = await sse_post(gw.http_url, {**HI, "text": "Hello there. " * 20})  # prose
        assert "error" not in reply.names


async def test_streamed_text_stops_where_its_speech_passes_the_limit(
    fake_server: RunningServer,
) -> None:
    with gateway(fake_server, admission=False, max_reply_audio_s=20) as gw:
        async with connect(gw.ws_url + WS) as ws:
            await ws.send(orjson.dumps({"type": "speak", "format": "pcm"}).decode())
            for delta in ("Here are the numbers. ", NUMBER, NUMBER, NUMBER, "Done."):
                await ws.send(orjson.dumps({"type": "text", "delta": delta}).decode())
            await ws.send('{"type": "flush"}')
            audio, events = await ws_events(ws)
        assert error_codes(events) == ["reply_too_long"]
        spoken = "".join(e["text"] for e in events if e["type"] == "text_delta")
        assert spoken == "Here are the numbers. " + NUMBER  # the second number crossed 20 s
        assert len(audio) > 0  # what came before the limit was spoken


def test_a_host_header_is_host_and_port_exactly() -> None:
    assert host_name("[::1]:8000") == "[::1]"
    assert host_name("localhost:8000") == "localhost"
    for forged in ("[::1]evil.example", "[::1]:80evil", "localhost:80:80", "localhost:x", "::1"):
        assert host_name(forged) == "", forged
    policy = AccessPolicy(keys=None, hosts=LOOPBACK_HOSTS)
    request = RequestFacts("GET", "/", {"host": "[::1]evil.example"}, None, "127.0.0.1")
    denial = policy.check(request, 0)
    assert isinstance(denial, Denial)
    assert (denial.status, denial.code) == (400, "host_not_allowed")


async def test_an_empty_voice_is_the_default_and_speed_true_is_refused_on_every_route(
    fake_server: RunningServer,
) -> None:
    with gateway(fake_server, admission=False) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            async with http.stream("POST", "/v1/speak", json={**HI, "voice": ""}) as r:
                assert r.status_code == 200
                reply = await read_sse(r)
            assert "error" not in reply.names
            speech = await http.post("/v1/audio/speech", json={"input": "Hi.", "voice": ""})
            assert speech.status_code == 200
            assert len(speech.content) > 0
            for route, body in (
                ("/v1/speak", {**HI, "speed": True}),
                ("/v1/audio/speech", {"input": "Hi.", "speed": True}),
                ("/invocations", {**HI, "speed": True}),
            ):
                response = await http.post(route, json=body)
                assert code_of(response) == (400, "invalid_field"), route
            ints = await http.post("/v1/audio/speech", json={"input": "Hi.", "speed": 1})
            assert ints.status_code == 200
        async with connect(gw.ws_url + WS) as ws:
            await ws.send(orjson.dumps({"type": "speak", **HI, "speed": True}).decode())
            error = orjson.loads(await ws.recv())
            assert (error["type"], error["code"]) == ("error", "invalid_field")
            await ws.send(orjson.dumps({"type": "speak", **HI, "voice": ""}).decode())
            audio, events = await ws_events(ws)
            assert error_codes(events) == []
            assert len(audio) > 0


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian chromium missing")
@pytest.mark.parametrize("transport", ["sse", "ws"])
async def test_the_demo_page_speaks_unpaced_where_pacing_is_off(
    browser: Browser, fake_server: RunningServer, transport: str
) -> None:
    """The page paces its text (`echo_tps`) by default; a gateway that does not honour pacing
    refuses that, and the page asks again unpaced (EventSource cannot read why it was
    refused; the WebSocket says `echo_pacing_disabled`)."""
    with beyond_loopback(fake_server, admission=False) as gw:
        page, _ = await open_demo(browser, gw.http_url)
        await speak(page, transport=transport, fmt="pcm", text="Hello there, from the demo.")
        await wait_for_state(page, "done")
        proof = await played_proof(page)
        assert (proof["state"], proof["error"]) == ("done", None)
        assert proof["bytes"] > 0
        states = await page.evaluate("window.demo.states")
        assert "error" in states  # the paced ask, refused
        pace = await page.evaluate("document.querySelector('#tps').value")
        assert pace == ("0" if transport == "ws" else "200")  # told why: no pace from now on
        await page.close()
