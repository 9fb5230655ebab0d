"""Draining (Kubernetes' preStop hook): /ping counts what is in flight, `model-server-drain`
waits for it to reach zero."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from model_server.drain import main as drain_main
from model_server.drain import wait_drained
from tests.support.fakes import FakeEngine
from tests.support.model_server_client import read_until_terminal, synth
from tests.support.servers import RunningServer

BIDI = "/invocations-bidirectional-stream"


async def _inflight(server: RunningServer) -> int:
    async with httpx.AsyncClient(base_url=server.http_url) as client:
        body = (await client.get("/ping")).json()
    assert body["status"] == "ok"
    return int(body["inflight"])


async def test_sessions_and_requests_count_until_they_end(
    own_fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    fake_server = own_fake_server
    assert await _inflight(fake_server) == 0  # /ping itself does not count
    fake_engine.hold = True
    async with connect(fake_server.ws_url + BIDI) as ws:
        assert await _inflight(fake_server) == 1  # an idle session counts: it may speak again
        async with httpx.AsyncClient(base_url=fake_server.http_url, timeout=30) as client:
            post = asyncio.create_task(client.post("/invocations", json={"text": "Held."}))
            await asyncio.to_thread(fake_engine.entered.wait, 10)
            assert await _inflight(fake_server) == 2
            # the hook, meanwhile, reports what it would leave behind
            assert await asyncio.to_thread(wait_drained, fake_server.http_url, 0) == 2
            fake_engine.hold = False
            fake_engine.gate.set()
            assert (await post).status_code == 200
        await ws.send(synth("Still usable.", "r"))
        assert (await read_until_terminal(ws, "r")).last["type"] == "synthesis_complete"
        await ws.send(orjson.dumps({"type": "close"}))
    # the server finishes the session after the client's close; the hook waits for that
    assert await asyncio.to_thread(wait_drained, fake_server.http_url, 30, 0.05) == 0
    assert await _inflight(fake_server) == 0


def test_an_absent_server_has_nothing_to_drain() -> None:
    assert wait_drained("http://127.0.0.1:9", 5) == 0


async def test_the_hook_exits_zero_even_when_time_runs_out(own_fake_server: RunningServer) -> None:
    async with connect(own_fake_server.ws_url + BIDI):
        assert await _inflight(own_fake_server) == 1  # a session that will not end in time

        def drain() -> object:
            with pytest.raises(SystemExit) as exit_info:
                drain_main(["--url", own_fake_server.http_url, "--timeout", "0"])
            return exit_info.value.code

        assert await asyncio.to_thread(drain) == 0
