"""Admission across a fleet (`gateway.fleet.asks`): what each gateway's replies ask of a
model server, published in a real `redis-server` and counted by the others, so two gateways
in front of one model server refuse what one would."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.fleet import asks as fleet_asks
from gateway.fleet.asks import FleetAsks, decode, encode
from gateway.fleet.store import Store
from kokoro_contract.asks import Ask
from tests.support.fakes import FakeEngine
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import RunningServer, serve

HI = {"text": "Hello there.", "format": "pcm"}
# A's reply: long, so it has seconds of synthesis left however long its first chunk is held (a
# one-chunk reply held past its estimate looks done any moment, and a second reply then fits
# beside it on the server's two workers: admitted on a machine slow to send the second one)
LONG = {"text": " ".join(["Here is one more sentence of a long reply."] * 8), "format": "pcm"}


@pytest.fixture
def redis_db() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


async def eventually(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    """Polled: another gateway's write, or an expiry, has no event to wait on here."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)


def test_asks_travel_as_json_and_back() -> None:
    asks = (Ask(), Ask.under_way([(0.5, 1.25), (2.0, 0.0)]), Ask.under_way())
    assert encode(asks) == "[null,[[0.5,1.25],[2.0,0.0]],[]]"
    assert decode(encode(asks)) == asks


async def test_each_gateway_reads_the_others_asks_never_its_own(redis_db: RedisServer) -> None:
    stores = [Store(redis_db.url, prefix="test", timeout_s=1.0) for _ in range(2)]
    for store in stores:
        await store.start()
    a, b = (FleetAsks(store) for store in stores)
    url, idle = "http://10.0.0.1:8080", "http://10.0.0.2:8080"
    mine: dict[str, tuple[Ask, ...]] = {url: (Ask(),), idle: ()}
    await a.start(lambda: mine)
    a.changed()
    await eventually(lambda: bool(redis_db.client().hlen("{test}:asks:" + url)))
    assert await b.others([url, idle]) == {url: (Ask(),), idle: ()}
    assert await a.others([url, idle]) == {url: (), idle: ()}
    mine[url] = (Ask.under_way([(1.5, 0.5)]),)  # a chunk done: written at once
    a.changed()
    await eventually(lambda: "1.5" in (redis_db.client().hget("{test}:asks:" + url, a.name) or ""))
    assert await b.others([url]) == {url: (Ask.under_way([(1.5, 0.5)]),)}
    await a.aclose()  # its asks gone at once
    assert await b.others([url]) == {url: ()}
    for store in stores:
        await store.aclose()


async def test_a_dead_gateways_asks_expire(
    redis_db: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fleet_asks, "TTL_S", 0.2)
    stores = [Store(redis_db.url, prefix="test", timeout_s=1.0) for _ in range(2)]
    for store in stores:
        await store.start()
    dead, live = FleetAsks(stores[0]), FleetAsks(stores[1])
    url = "http://10.0.0.1:8080"
    await dead.start(lambda: {url: (Ask(),)})
    dead.changed()
    await eventually(lambda: bool(redis_db.client().hlen("{test}:asks:" + url)))
    assert _publishing(dead) is not None
    _publishing(dead).cancel()  # it stops writing, and says nothing: as a killed process
    with contextlib.suppress(asyncio.CancelledError):
        await _publishing(dead)
    answers: list[Any] = []

    async def gone() -> None:
        while (seen := await live.others([url])) != {url: ()}:
            answers.append(seen)
            await asyncio.sleep(0.02)

    await asyncio.wait_for(gone(), 20)
    assert answers  # it was there until it expired
    assert redis_db.client().hlen("{test}:asks:" + url) == 0  # and the read dropped it
    for store in stores:
        await store.aclose()


def _publishing(asks: FleetAsks) -> asyncio.Task[None]:
    task = asks._publishing
    assert task is not None
    return task


@contextlib.contextmanager
def gateway(server: RunningServer, redis_url: str | None) -> Iterator[RunningServer]:
    """Admission on, refusing at once what it would refuse (no wait for spare time)."""
    settings: dict[str, Any] = {"admission_wait_s": 0.0, "replies_per_minute": 0}
    if redis_url is not None:  # a deadline a busy test machine does not pass by accident
        settings |= {"redis_url": redis_url, "redis_timeout_s": 2.0}
    app = create_gateway(GatewaySettings(model_server_url=server.http_url, **settings))
    with serve(app) as running:
        yield running


@pytest.mark.parametrize("fleet", [False, True], ids=["alone", "fleet"])
async def test_two_gateways_refuse_what_one_would(
    own_fake_server: RunningServer, fake_engine: FakeEngine, redis_db: RedisServer, fleet: bool
) -> None:
    """A reply synthesizing on the one model server (its engine held) through gateway A: a
    second reply is refused by A, and, in a fleet, by B too; counting alone B took it (each
    gateway admitted up to the whole server)."""
    url = redis_db.url if fleet else None
    fake_engine.hold = True
    try:
        with gateway(own_fake_server, url) as a, gateway(own_fake_server, url) as b:
            async with connect(a.ws_url + "/v1/speak/ws") as first:
                await first.send(orjson.dumps({"type": "speak", **LONG}).decode())
                assert orjson.loads(await first.recv())["type"] == "agent_start"
                assert await asyncio.to_thread(fake_engine.entered.wait, 10)
                if fleet:  # A's asks written (a change is written at once)
                    await eventually(lambda: _asks_written(redis_db))
                async with httpx.AsyncClient(timeout=15) as http:
                    by_a = await http.post(a.http_url + "/v1/speak", json=HI)
                    assert by_a.status_code == 503
                    assert by_a.json()["error"]["code"] == "overloaded"
                    fake_engine.hold = False  # what B takes, it can speak
                    by_b = await http.post(b.http_url + "/v1/speak", json=HI)
                    if fleet:
                        assert by_b.status_code == 503
                        assert by_b.json()["error"]["code"] == "overloaded"
                    else:
                        assert by_b.status_code == 200
                        assert b"agent_end" in by_b.content
                    fake_engine.gate.set()  # A's reply ends: spoken whole
                    kinds: list[str] = []
                    while not kinds or kinds[-1] not in ("agent_end", "error"):
                        message = await first.recv()
                        if isinstance(message, str):
                            kinds.append(orjson.loads(message)["type"])
                    assert kinds[-1] == "agent_end"
    finally:
        fake_engine.hold = False
        fake_engine.gate.set()


def _asks_written(redis_db: RedisServer) -> bool:
    client = redis_db.client()
    return any(client.hlen(key) for key in client.scan_iter("{kokoro-gateway}:asks:*"))
