"""The model server's own bounds (issue #49, finding 10): the largest body it reads
(`--max-body-bytes`), the sessions it keeps open at once (`--max-sessions`), and how long a
session that asks for nothing stays (`--idle-timeout-s`). Its real app and routes over the fake
engine, on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from kokoro_contract import protocol
from tests.support.fakes import FakeEngine, serve_fake
from tests.support.model_server_client import read_until_terminal, synth


async def test_a_body_past_the_limit_is_413_declared_or_streamed(fake_engine: FakeEngine) -> None:
    with serve_fake(fake_engine, max_body_bytes=4096) as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=15) as http:
            padded = {"text": "Hi.", "format": "pcm", "padding": "x" * 8192}
            declared = await http.post("/invocations", json=padded)
            assert declared.status_code == 413
            assert declared.json()["error"]["code"] == "body_too_large"

            async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: chunked
                body = orjson.dumps(padded)
                for i in range(0, len(body), 1024):
                    yield body[i : i + 1024]

            streamed = await http.post("/invocations", content=chunks())
            assert streamed.status_code == 413
            assert streamed.json()["error"]["code"] == "body_too_large"
            small = await http.post("/invocations", json={"text": "Hi.", "format": "pcm"})
            assert small.status_code == 200
            assert len(small.content) > 0


async def test_a_session_past_the_limit_is_refused_and_one_freed_is_taken(
    fake_engine: FakeEngine,
) -> None:
    with serve_fake(fake_engine, max_sessions=1) as server:
        url = server.ws_url + protocol.PATH
        async with connect(url) as first:
            async with connect(url) as second:
                error = orjson.loads(await second.recv())
                assert error == {
                    "type": "error",
                    "code": "too_many_sessions",
                    "message": "this model server has 1 sessions open, its limit: try again later",
                }
                with pytest.raises(ConnectionClosed):
                    await second.recv()
                assert second.close_code == 1013
            await first.send(synth("Still here.", "r1"))
            reply = await read_until_terminal(first, "r1")
            assert reply.last["type"] == "synthesis_complete"
        async with connect(url) as again:  # the first one closed: its place is free
            await again.send(synth("Hello again.", "r2"))
            assert (await read_until_terminal(again, "r2")).last["type"] == "synthesis_complete"


async def test_a_session_that_asks_for_nothing_is_closed_after_the_idle_timeout(
    fake_engine: FakeEngine,
) -> None:
    with serve_fake(fake_engine, idle_timeout_s=0.5) as server:
        async with connect(server.ws_url + protocol.PATH) as ws:
            await ws.send(synth("One request first.", "r1"))
            reply = await read_until_terminal(ws, "r1")
            assert reply.last["type"] == "synthesis_complete"
            # then nothing: told why, and closed normally
            error = orjson.loads(await ws.recv())
            assert (error["type"], error["code"]) == ("error", "idle_timeout")
            with pytest.raises(ConnectionClosed):
                await ws.recv()
            assert (ws.close_code, ws.close_reason) == (1000, "idle_timeout")
