"""A model server that freezes mid-reply (SIGSTOP) is noticed by the session's pings within a
few seconds, whatever audio the listener has buffered: the reply resumes on another model
server from where the listener is (no repeat, no hole), or, with none up, ends with the
retryable `tts_stalled`. New replies go elsewhere meanwhile. Real processes, real signals."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.sources.sse import SSEDecoder
from tests.support.fakes import paced_reply_bytes
from tests.support.gateway_client import SSEReply, counted, metric, sse_get
from tests.support.processes import fake_model_server
from tests.support.servers import RunningServer, free_port, serve

# model-server processes stopped and run again, a paced reply of seconds each: `make test-quick`
# leaves the file out
pytestmark = pytest.mark.slow

# paced like an LLM: the reply runs for seconds, each chunk sent as its text is complete
PACED = {"text": "This reply keeps talking for a while. " * 6, "format": "pcm", "echo_tps": "20"}


@contextlib.contextmanager
def gateway(urls: list[str], **overrides: Any) -> Iterator[RunningServer]:
    settings = GatewaySettings(model_server_url=",".join(urls), tts_timeout_s=60, **overrides)
    with serve(create_gateway(settings)) as gw:
        yield gw


def inflight(url: str) -> int:
    return int(httpx.get(url + "/ping", timeout=2).json()["inflight"])


async def reply_freezing(base: str, freeze: Any) -> SSEReply:
    """A paced reply; `freeze()` once its second audio chunk has come; all of it."""
    reply = SSEReply()
    async with (
        httpx.AsyncClient(base_url=base, timeout=120) as http,
        http.stream("GET", "/v1/speak/sse", params=PACED) as r,
    ):
        assert r.status_code == 200
        decoder = SSEDecoder()
        async for raw in r.aiter_raw():
            for event in decoder.push(raw):
                reply.events.append(event)
                if event.event == "audio_chunk" and len(reply.data("audio_chunk")) == 2:
                    freeze()
    return reply


async def test_a_frozen_server_mid_reply_is_left_and_the_reply_goes_on_elsewhere() -> None:
    ports = [free_port(), free_port()]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    with (
        fake_model_server(ports[0]) as first,
        fake_model_server(ports[1]) as second,
        gateway(urls, chunk_plan="sentences") as gw,  # chunks cut the same under any load
    ):
        procs = dict(zip(urls, (first, second), strict=True))
        frozen: list[str] = []

        def freeze() -> None:
            (serving,) = [u for u in urls if inflight(u) == 1]  # the server of this reply
            os.kill(procs[serving].pid, signal.SIGSTOP)
            frozen.append(serving)

        reply = await reply_freezing(gw.http_url, freeze)
        assert "error" not in reply.names
        assert frozen
        metrics = reply.one("agent_end")["metrics"]
        assert metrics["text_chars"] == len(PACED["text"])
        # every segment's audio once, as the fake engine voices it: what was heard before the
        # freeze is not said again, and what was not heard is said by the other server
        assert len(b"".join(reply.audio_chunks())) == paced_reply_bytes(PACED["text"])
        assert await counted(gw, "gateway_errors_total", code="tts_stalled") == 0
        # the frozen one is marked down: a new reply goes to the other
        (alive,) = [u for u in urls if u not in frozen]
        before = inflight(alive)
        again = await sse_get(gw.http_url, {"text": "Still here.", "format": "pcm"})
        assert "error" not in again.names
        assert len(b"".join(again.audio_chunks())) > 0
        assert before == 0


async def test_a_frozen_server_with_no_other_ends_the_reply_with_tts_stalled() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with fake_model_server(port) as proc, gateway([url]) as gw:
        reply = await reply_freezing(gw.http_url, lambda: os.kill(proc.pid, signal.SIGSTOP))
        assert reply.names[-2:] == ["error", "agent_end"]
        error = reply.one("error")
        # the pings noticed it, not the chunk's due time (tts_timeout, 60 s past due here)
        assert (error["code"], error["retryable"]) == ("tts_stalled", True)
        assert len(b"".join(reply.audio_chunks())) > 0  # heard until then
        assert await metric(gw, "gateway_errors_total", code="tts_stalled") == 1
