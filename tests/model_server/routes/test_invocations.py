"""POST /invocations against SageMaker's limits: a non-streamed request that could not finish
within the invocation's time is refused before any synthesis, a request whose client goes
away stops at the engine's next step (on both the streamed and the whole-body paths), and a
streamed answer whose synthesis fails is cut, never ended as if whole."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from contextlib import AbstractContextManager
from typing import Any

import httpx
import pytest

from tests.support.fakes import FailingEngine, FakeEngine, expected_pcm_bytes, serve_fake
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
            # the running call was told to stop (its thread sees it a moment after the request
            # is no longer counted: waited for, not looked at once)
            assert await asyncio.to_thread(fake_engine.cancel_seen.wait, 10)
            assert fake_engine.calls == ["First one."]  # and none of the four after it ran
            fake_engine.hold = False
            again = await http.post("/invocations", json={"text": "Still here.", "stream": stream})
            assert again.status_code == 200
            assert len(again.content) > 0


async def read_streamed(http: httpx.AsyncClient, body: dict[str, Any], into: bytearray) -> None:
    """A streamed answer's body, read into `into` as it comes (kept when it breaks off)."""
    async with http.stream("POST", "/invocations", json=body) as streamed:
        assert streamed.status_code == 200
        async for part in streamed.aiter_raw():
            into += part


async def test_a_synthesis_failing_after_the_headers_cuts_the_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A streamed answer whose third segment fails: the first two segments' audio, then the
    connection drops before the body's end (SageMaker tells its caller `ModelStreamError`), never
    a clean end that would pass for the whole answer; the whole-body path answers 500 with the
    error's code. The server logs why in one line, no traceback, and serves the next request."""
    engine = FailingEngine(fails_on="Third")
    uvicorn_log = logging.getLogger("uvicorn.error")  # its records stop at "uvicorn": read here
    with contextlib.ExitStack() as stack, model_server(engine) as server:
        uvicorn_log.addHandler(caplog.handler)  # (once uvicorn has set its own handlers)
        stack.callback(uvicorn_log.removeHandler, caplog.handler)
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
            received = bytearray()
            with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
                await read_streamed(http, {"text": FIVE, "stream": True}, received)
            assert engine.calls == ["First one.", "Second one.", "Third one."]
            assert len(received) == expected_pcm_bytes("First one.") + expected_pcm_bytes(
                "Second one."
            )
            whole = await http.post("/invocations", json={"text": FIVE})
            assert whole.status_code == 500
            assert whole.json()["error"]["code"] == "synthesis_failed"
            assert (await http.post("/invocations", json={"text": "Fine."})).status_code == 200
    logged = [r for r in caplog.records if r.name.startswith(("model_server", "uvicorn"))]
    assert [r.getMessage().split(" ", 2)[2] for r in logged if "cut short" in r.getMessage()] == [
        f"cut short: {FailingEngine.failure}"
    ]
    assert not [r for r in logged if r.levelno >= logging.ERROR or r.exc_info]
