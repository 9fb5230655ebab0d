"""Real time under load, end to end over real servers on loopback (the fake engine): deadline
scheduling in the model server, admission control and failover in the gateway."""

from __future__ import annotations

import asyncio
import dataclasses
import socket

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.routing import pool
from gateway.routing.admission import Refusal
from kokoro_contract import protocol
from kokoro_contract.asks import Ask
from model_server.app import create_app
from tests.conftest import FAKE_SETTINGS
from tests.support.fakes import FakeEngine, expected_pcm_bytes, identity_g2p
from tests.support.gateway_client import (
    NoSuchSeries,
    metric,
    model_server_pool,
    sse_get,
    wait_for_metric,
)
from tests.support.model_server_client import read_until_terminal
from tests.support.servers import RunningServer, free_port, serve
from tests.support.steps import until


async def test_a_new_replys_first_chunk_goes_ahead_of_later_chunks_with_slack(
    fake_engine: FakeEngine,
) -> None:
    settings = dataclasses.replace(FAKE_SETTINGS, workers=1)
    app = create_app(settings, engine_factory=lambda _: fake_engine, g2p_factory=identity_g2p)
    with serve(app) as server:
        assert app.state.service.settled.wait(10)
        fake_engine.hold = True
        async with (
            connect(server.ws_url + protocol.PATH) as busy,
            connect(server.ws_url + protocol.PATH) as later,
            connect(server.ws_url + protocol.PATH) as new,
        ):
            await busy.send(protocol.synthesize_message("Holding the worker.", "h"))
            await asyncio.to_thread(fake_engine.entered.wait, 10)  # the one worker is taken
            # a reply's later chunk, needed in 8 s, is queued first...
            await later.send(protocol.synthesize_message("Later chunk.", "l", deadline_ms=8000))
            await _until_waiting(server, 1)
            # ...then a new reply's first chunk, needed at once
            await new.send(protocol.synthesize_message("First chunk.", "f", deadline_ms=0))
            await _until_waiting(server, 2)
            fake_engine.hold = False
            fake_engine.gate.set()
            for ws, rid in ((busy, "h"), (new, "f"), (later, "l")):
                assert (await read_until_terminal(ws, rid)).last["type"] == "synthesis_complete"
        assert fake_engine.calls == ["Holding the worker.", "First chunk.", "Later chunk."]


async def _until_waiting(server: RunningServer, n: int) -> None:
    """Poll the model server's own load report until `n` segments wait for a worker."""
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        for _ in range(500):
            if (await http.get("/load")).json()["waiting"] == n:
                return
            await asyncio.sleep(0.01)  # a poll of state the server reports, not a timing bet
    raise AssertionError(f"never {n} waiting")


async def test_load_and_metrics_report_the_scheduler(fake_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        body = (await http.get("/load")).json()
    assert body["workers"] == 2
    assert body["scheduling"] == "edf"
    assert {"backlog_s", "busy", "waiting", "min_slack_s", "deadline_misses"} <= set(body)
    assert (body["busy"], body["waiting"], body["backlog_s"]) == (0, 0, 0.0)  # idle now
    # the metrics report the same scheduler, series by series
    assert await metric(fake_server, "model_server_workers") == 2
    assert await metric(fake_server, "model_server_busy_workers") == 0
    assert await metric(fake_server, "model_server_waiting_segments") == 0
    assert await metric(fake_server, "model_server_backlog_seconds") == 0
    misses = await metric(fake_server, "model_server_deadline_misses_total")
    assert misses == body["deadline_misses"]


async def test_metrics_count_the_engine_calls_and_their_time(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    calls = await metric(fake_server, "model_server_engine_calls_total")
    seconds = await metric(fake_server, "model_server_engine_seconds_total")
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        answer = await http.post("/invocations", json={"text": "Hello there. How are you?"})
    assert answer.status_code == 200
    assert len(answer.content) == sum(expected_pcm_bytes(t) for t in fake_engine.calls)
    assert fake_engine.calls == ["Hello there.", "How are you?"]  # one call per sentence
    assert await metric(fake_server, "model_server_engine_calls_total") - calls == 2
    assert await metric(fake_server, "model_server_engine_seconds_total") - seconds > 0


async def test_a_reply_in_progress_reads_1_on_the_gauges(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    """Mid-reply (the engine holds its call), the gateway's active-replies gauge and the model
    server's busy-workers gauge both read 1; after it, 0. Before the gateway's first reply the
    gauge has no series at all, which is not 0."""
    settings = GatewaySettings(model_server_url=fake_server.http_url)
    with serve(create_gateway(settings)) as gw:
        with pytest.raises(NoSuchSeries):
            await metric(gw, "gateway_active_sessions", transport="sse")
        fake_engine.hold = True
        reply = asyncio.create_task(sse_get(gw.http_url, {"text": "Held.", "format": "pcm"}))
        assert await asyncio.to_thread(fake_engine.entered.wait, 10)
        assert await metric(gw, "gateway_active_sessions", transport="sse") == 1
        assert await metric(fake_server, "model_server_busy_workers") == 1
        fake_engine.gate.set()
        done = await reply
        assert "error" not in done.names
        assert len(b"".join(done.audio_chunks())) == expected_pcm_bytes("Held.")
        assert await wait_for_metric(gw, "gateway_active_sessions", 0, transport="sse") == 0
        assert await metric(fake_server, "model_server_busy_workers") == 0


@pytest.fixture
def refusing_gateway(fake_server: RunningServer):  # type: ignore[no-untyped-def]
    """A gateway whose budget no first audio can meet: it refuses every reply."""
    settings = GatewaySettings(model_server_url=fake_server.http_url, first_audio_budget_s=0.0)
    with serve(create_gateway(settings)) as running:
        yield running


async def test_an_overloaded_gateway_refuses_before_the_stream_starts(
    refusing_gateway: RunningServer,
) -> None:
    async with httpx.AsyncClient(base_url=refusing_gateway.http_url) as http:
        for r in (
            await http.get("/v1/speak/sse", params={"text": "Hello there."}),
            await http.post("/v1/speak", json={"text": "Hello there."}),
            await http.post("/v1/audio/speech", json={"input": "Hello there."}),
        ):
            path = r.request.url.path
            assert r.status_code == 503, path
            assert r.headers["content-type"] == "application/json"
            error = r.json()["error"]
            assert (error["code"], error["retryable"]) == ("overloaded", True)
            assert "first audio would take" in error["message"]
            assert int(r.headers["retry-after"]) >= 1
    assert await metric(refusing_gateway, "gateway_refused_total", code="overloaded") == 3
    with pytest.raises(NoSuchSeries):  # refused before it ran: never an active session
        await metric(refusing_gateway, "gateway_active_sessions", transport="sse")
    # a first audio past the budget is refused at once: waiting would only shrink the budget
    assert await metric(refusing_gateway, "gateway_admission_wait_seconds_count") == 3
    assert await metric(refusing_gateway, "gateway_admission_waiting") == 0


async def test_the_websocket_answers_overloaded_and_stays_usable(
    refusing_gateway: RunningServer,
) -> None:
    async with connect(refusing_gateway.ws_url + "/v1/speak/ws") as ws:
        for uid in ("u1", "u2"):  # refused twice: the session is not left busy
            speak = {"type": "speak", "text": "Hi.", "utterance_id": uid}
            await ws.send(orjson.dumps(speak).decode())
            error = orjson.loads(await ws.recv())
            assert error["type"] == "error"
            assert (error["code"], error["retryable"], error["utterance_id"]) == (
                "overloaded",
                True,
                uid,
            )
            assert error["retry_after_s"] >= 1
        await ws.send('{"type": "cancel"}')
        assert orjson.loads(await ws.recv())["code"] == "nothing_to_cancel"


async def test_a_reply_fails_over_from_a_stopped_model_server(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    doomed_engine = FakeEngine()
    app = create_app(
        FAKE_SETTINGS, engine_factory=lambda _: doomed_engine, g2p_factory=identity_g2p
    )
    async with httpx.AsyncClient() as client:
        with serve(app) as doomed:
            assert app.state.service.settled.wait(10)
            servers = pool.ModelServerPool([doomed.http_url, fake_server.http_url], client)
            assert isinstance(await servers.pick(3.0), pool.Upstream)  # both are up now
            chosen = next(u for u in servers.upstreams if u.url == doomed.http_url)
        # the doomed server has stopped after it was chosen: the reply goes to the other one
        transport = servers.transport_for(chosen)
        plan = ChunkPlan()
        transport.track(plan)
        assert (chosen.replies, chosen.plans) == (1, [plan])
        async with transport.open(None, 1.0) as tts:
            # and counts there, once, with its plan: admission there sees it, here nothing
            other = transport.upstream
            assert other.url == fake_server.http_url
            assert (chosen.replies, chosen.plans, other.replies, other.plans) == (0, [], 1, [plan])
            await tts.send("After the stop.")
            await tts.end_input()
            pcm = b"".join([chunk async for chunk in tts.audio() if isinstance(chunk, bytes)])
        transport.release()
        assert (chosen.replies, other.replies, other.plans, other.asks(0.0)) == (0, 0, [], ())
        await servers.aclose()
    assert len(pcm) > 0
    assert fake_engine.calls == ["After the stop."]
    assert doomed_engine.calls == []
    assert not chosen.up  # skipped until it is tried again


async def test_a_gateway_skips_a_model_server_that_is_down(fake_server: RunningServer) -> None:
    urls = f"http://127.0.0.1:9,{fake_server.http_url}"  # nothing listens on port 9
    with serve(create_gateway(GatewaySettings(model_server_url=urls))) as gw:
        for text in ("One.", "Two."):
            reply = await sse_get(gw.http_url, {"text": text, "format": "pcm"})
            assert "error" not in reply.names
            assert sum(len(c) for c in reply.audio_chunks()) > 0


async def test_a_name_with_several_addresses_is_several_servers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    loop = asyncio.get_running_loop()

    async def getaddrinfo(host: str, port: int | None, **kwargs: object) -> list[tuple]:  # type: ignore[type-arg]
        assert host == "model-server.voice.svc.cluster.local"
        return [
            (socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port))
            for a in ("10.0.0.7", "10.0.0.5", "10.0.0.7")
        ]

    monkeypatch.setattr(loop, "getaddrinfo", getaddrinfo)
    assert await pool.expand("http://model-server.voice.svc.cluster.local:8080") == [
        "http://10.0.0.5:8080",
        "http://10.0.0.7:8080",
    ]
    assert await pool.expand("http://127.0.0.1:8080/") == ["http://127.0.0.1:8080"]


async def test_a_reply_that_has_not_started_keeps_a_second_ask_out_until_it_has(
    own_fake_server: RunningServer,
) -> None:
    # a model server of its own: nothing learned, its real-time capacity (2) from the priors
    async with model_server_pool(own_fake_server.http_url) as servers:
        first = await servers.pick(budget_s=3.0)
        assert isinstance(first, pool.Upstream)
        transport = servers.transport_for(first)
        plan = ChunkPlan()
        transport.track(plan)  # asked, nothing sent yet: it is about to need the engine
        refused = await servers.pick(budget_s=3.0)
        assert isinstance(refused, Refusal)
        assert refused.code == "overloaded"
        assert refused.reason.startswith("replies in progress would fall behind")
        assert refused.retry_after_s >= 1
        assert await servers.pick(budget_s=None) == first  # no admission: routed anyway
        transport.release()  # it ended: its plan no longer counts
        assert first.plans == []
        assert await servers.pick(budget_s=3.0) == first


async def test_asks_wait_their_turn_for_spare_time_rather_than_being_refused(
    own_fake_server: RunningServer,
) -> None:
    async with model_server_pool(own_fake_server.http_url) as servers:
        running = await servers.admit(budget_s=3.0, wait_s=30.0)
        assert isinstance(running, pool.PooledTransport)
        upstream = running.upstream
        # admitted, no plan yet: starting, with a typical reply's work ahead of it
        assert upstream.asks(0.0) == (Ask(),)
        running.track(ChunkPlan())  # asked, nothing sent yet: still starting
        assert upstream.asks(0.0) == (Ask(),)
        first = asyncio.create_task(servers.admit(budget_s=3.0, wait_s=30.0))
        await until(lambda: servers.waiting == 1)
        second = asyncio.create_task(servers.admit(budget_s=3.0, wait_s=30.0))
        await until(lambda: servers.waiting == 2)
        assert not first.done()
        assert not second.done()

        running.release()  # it ended: the first to ask takes its place, the second waits on
        taken = await first
        assert isinstance(taken, pool.PooledTransport)
        assert taken.upstream is upstream
        assert upstream.replies == 1
        await until(lambda: servers._turn.locked())  # the second looked again, and waits
        assert not second.done()
        assert servers.waiting == 1

        taken.track(None)  # started (a reply with no playback plan: no spare time to give)
        taken.release()
        then = await second
        assert isinstance(then, pool.PooledTransport)
        assert then.upstream is upstream
        assert servers.waiting == 0
        assert upstream.replies == 1
        then.release()
        assert upstream.replies == 0
        assert upstream.asks(0.0) == ()


async def test_an_ask_that_waits_too_long_or_leaves_reserves_nothing(
    own_fake_server: RunningServer,
) -> None:
    async with model_server_pool(own_fake_server.http_url) as servers:
        running = await servers.admit(budget_s=3.0)
        assert isinstance(running, pool.PooledTransport)
        running.track(ChunkPlan())
        refused = await servers.admit(budget_s=3.0, wait_s=0.3)  # nothing ends meanwhile
        assert isinstance(refused, Refusal)
        assert refused.deferrable
        assert refused.reason.startswith("replies in progress would fall behind")
        assert servers.waiting == 0
        assert running.upstream.replies == 1

        left = asyncio.create_task(servers.admit(budget_s=3.0, wait_s=30.0))
        await until(lambda: servers.waiting == 1)
        left.cancel()  # its client went away while it waited
        with pytest.raises(asyncio.CancelledError):
            await left
        assert servers.waiting == 0
        assert running.upstream.replies == 1
        running.release()

    # no server answers at all: nothing to wait for
    async with model_server_pool(f"http://127.0.0.1:{free_port()}") as gone:
        unavailable = await gone.admit(budget_s=3.0, wait_s=600.0)
        assert isinstance(unavailable, Refusal)
        assert unavailable.code == "tts_unavailable"
        assert not unavailable.deferrable


IDLE_LOAD = {  # what GET /load says of an idle server with two workers
    "workers": 2,
    "busy": 0,
    "waiting": 0,
    "backlog_s": 0.0,
    "min_slack_s": None,
    "seconds_per_call": 0.35,
    "seconds_per_phoneme": 0.028,
}


async def test_a_server_slow_to_report_its_load_keeps_its_last_answer() -> None:
    """A load probe that times out is a busy moment, not a server gone, if it answered lately
    (a fault injected in the probe client's transport)."""
    answers: list[str] = ["ok", "timeout", "timeout"]

    def load(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/load"
        if answers.pop(0) == "timeout":
            raise httpx.ReadTimeout("no answer in time", request=request)
        return httpx.Response(200, json=IDLE_LOAD)

    url = "http://127.0.0.1:9"  # never dialled: the probe client answers
    async with httpx.AsyncClient() as client:
        probe = httpx.AsyncClient(transport=httpx.MockTransport(load))
        servers = pool.ModelServerPool([url], client, probe=probe, load_ttl_s=0.0)
        try:
            assert isinstance(await servers.pick(3.0), pool.Upstream)  # answered
            slow = await servers.pick(3.0)  # timed out: its answer of a moment ago serves
            assert isinstance(slow, pool.Upstream)
            assert slow.up
            assert slow.load is not None
            assert slow.load.workers == 2
            servers.stale_load_s = 0.0  # now that answer is too old: a timeout means down
            gone = await servers.pick(3.0)
            assert isinstance(gone, Refusal)
            assert gone.code == "tts_unavailable"
            assert answers == []
        finally:
            await servers.aclose()


async def test_a_server_not_heard_from_yet_is_given_longer_to_report_its_load() -> None:
    """Until a server has answered `/load` once (a gateway just started, its first probe
    opening a connection), a probe waits `first_probe_s`; after, the probe client's short
    timeout, and an answer of a moment ago covers a slow one. A first probe that times out
    even so is a server down (the timeouts each probe was given are read from the requests)."""
    answers: list[str] = ["timeout", "ok", "ok"]
    waited: list[float] = []

    def load(request: httpx.Request) -> httpx.Response:
        waited.append(request.extensions["timeout"]["read"])
        if answers.pop(0) == "timeout":
            raise httpx.ReadTimeout("no answer in time", request=request)
        return httpx.Response(200, json=IDLE_LOAD)

    url = "http://127.0.0.1:9"  # never dialled: the probe client answers
    async with httpx.AsyncClient() as client:
        probe = httpx.AsyncClient(transport=httpx.MockTransport(load), timeout=httpx.Timeout(0.5))
        servers = pool.ModelServerPool([url], client, probe=probe, load_ttl_s=0.0)
        try:
            down = await servers.pick(3.0)  # no answer in 2 s: down, as before
            assert isinstance(down, Refusal)
            assert down.code == "tts_unavailable"
            assert isinstance(await servers.pick(3.0), pool.Upstream)  # asked again: it answers
            assert isinstance(await servers.pick(3.0), pool.Upstream)
        finally:
            await servers.aclose()
    assert servers.first_probe_s == 2.0
    assert waited == [2.0, 2.0, 0.5]
    assert answers == []
