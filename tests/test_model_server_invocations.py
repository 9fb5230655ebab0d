"""POST /invocations against SageMaker's limits: a non-streamed request that could not finish
within the invocation's time is refused before any synthesis, and a request whose client goes
away stops at the engine's next step (on both the streamed and the whole-body paths)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

from tests.support.fakes import FakeEngine, serve_fake
from tests.support.servers import RunningServer

FIVE = "First one. Second one. Third one. Fourth one. Fifth one."


def model_server(engine: FakeEngine, **settings: Any) -> AbstractContextManager[RunningServer]:
    """A fake model server of the test's own; its speed model has seen nothing (the prior)."""
    return serve_fake(engine, **settings)


async def inflight(http: httpx.AsyncClient) -> int:
    return int((await http.get("/ping")).json()["inflight"])


async def until_idle(http: httpx.AsyncClient) -> int:
    """`/ping`'s inflight once it reads 0, or what it reads after 20 s (polled as a drain
    script does: from outside there is no event to wait on)."""
    deadline = time.monotonic() + 20
    while (now := await inflight(http)) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    return now


async def test_a_whole_body_past_the_invocation_limit_is_refused_before_synthesis(
    fake_engine: FakeEngine,
) -> None:
    long_text = "Word " * 39 + "end."  # 199 phonemes: 0.35 + 0.028 x 199 = 5.9 s by the prior
    with model_server(fake_engine, invocation_timeout_s=3) as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
            refused = await http.post("/invocations", json={"text": long_text})
            assert refused.status_code == 413
            error = refused.json()["error"]
            assert error["code"] == "synthesis_too_long"
            assert "about 6 s" in error["message"]
            assert "past the 3 s" in error["message"]
            assert '"stream": true' in error["message"]
            assert fake_engine.calls == []  # refused before anything ran
            streamed = await http.post("/invocations", json={"text": long_text, "stream": True})
            assert streamed.status_code == 200
            assert len(streamed.content) > 0
            assert fake_engine.calls == [long_text]
            short = await http.post("/invocations", json={"text": "Hello there."})
            assert short.status_code == 200
            assert len(short.content) > 0
    with model_server(fake_engine, invocation_timeout_s=0) as server:  # 0: no limit
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
            assert (await http.post("/invocations", json={"text": long_text})).status_code == 200


@pytest.mark.parametrize("stream", [False, True], ids=["whole body", "streamed"])
async def test_a_client_that_leaves_stops_its_synthesis(
    fake_engine: FakeEngine, stream: bool
) -> None:
    fake_engine.hold = True  # the first engine call waits until it is cancelled
    with model_server(fake_engine) as server:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
            leaving = asyncio.create_task(
                http.post("/invocations", json={"text": FIVE, "stream": stream})
            )
            await asyncio.to_thread(fake_engine.entered.wait, 10)
            assert await inflight(http) == 1
            leaving.cancel()  # the client closes its connection
            with contextlib.suppress(asyncio.CancelledError):
                await leaving
            assert await until_idle(http) == 0
            assert fake_engine.cancel_seen.is_set()  # the running call was told to stop
            assert fake_engine.calls == ["First one."]  # and none of the four after it ran
            fake_engine.hold = False
            again = await http.post("/invocations", json={"text": "Still here.", "stream": stream})
            assert again.status_code == 200
            assert len(again.content) > 0
