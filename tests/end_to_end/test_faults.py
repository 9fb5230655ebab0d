"""Faults of whole processes and of the network, on real servers: a model server killed or
frozen mid-reply, a name that stops resolving, the gateway restarted under a listener. What
the client sees is checked by content (events, codes, close codes), never by timing."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.sources.sse import SSEDecoder, SSEEvent
from kokoro_contract import protocol
from tests.support.fakes import FakeEngine
from tests.support.gateway_client import metric, sse_get
from tests.support.processes import ROOT, fake_model_server, gateway_process, running
from tests.support.servers import RunningServer, free_port, serve

PACED = {
    "text": "This reply keeps talking for a while. " * 6,
    "format": "pcm",
    "echo_tps": "20",
}


@contextlib.contextmanager
def gateway(model_server_url: str, **overrides: Any) -> Iterator[RunningServer]:
    settings = GatewaySettings(model_server_url=model_server_url, **overrides)
    with serve(create_gateway(settings)) as gw:
        yield gw


@contextlib.asynccontextmanager
async def sse_events(base: str, params: dict[str, Any]) -> AsyncIterator[AsyncIterator[SSEEvent]]:
    async with (
        httpx.AsyncClient(base_url=base, timeout=60) as http,
        http.stream("GET", "/v1/speak/sse", params=params) as r,
    ):
        assert r.status_code == 200

        async def events() -> AsyncIterator[SSEEvent]:
            decoder = SSEDecoder()
            async for raw in r.aiter_raw():
                for event in decoder.push(raw):
                    yield event

        yield events()


async def reply_with_fault(base: str, fault: Any) -> list[SSEEvent]:
    """A paced reply; `fault()` once its first audio has come; every event up to the end."""
    seen: list[SSEEvent] = []
    async with sse_events(base, PACED) as events:
        async for event in events:
            seen.append(event)
            if event.event == "audio_chunk" and sum(e.event == "audio_chunk" for e in seen) == 1:
                fault()
    return seen


def error_of(events: list[SSEEvent]) -> dict[str, Any]:
    (error,) = [orjson.loads(e.data) for e in events if e.event == "error"]
    assert [e.event for e in events][-2:] == ["error", "agent_end"]
    return dict(error)


@pytest.mark.slow
async def test_a_killed_model_server_fails_the_reply_retryably_and_serves_again_once_back() -> None:
    port = free_port()
    with gateway(f"http://127.0.0.1:{port}") as gw:
        with fake_model_server(port) as proc:
            events = await reply_with_fault(gw.http_url, proc.kill)  # SIGKILL mid-reply
        error = error_of(events)
        assert error["retryable"] is True
        assert error["code"].startswith("tts_")
        assert any(e.event == "audio_chunk" for e in events)  # it was heard until then
        with fake_model_server(port):  # back on the same address; the gateway kept running
            reply = await sse_get(gw.http_url, {"text": "Hello again.", "format": "pcm"})
        assert "error" not in reply.names
        assert (
            len(b"".join(reply.audio_chunks())) == reply.one("agent_end")["metrics"]["audio_bytes"]
        )


@pytest.mark.slow
async def test_a_frozen_model_server_times_out_and_is_used_again_once_it_thaws() -> None:
    port = free_port()
    with (
        fake_model_server(port) as proc,
        gateway(f"http://127.0.0.1:{port}", tts_timeout_s=1, stall_timeout_s=0) as gw,
    ):  # no pings: the chunk's due time notices it (tests/end_to_end/test_stalls.py: the pings do)
        events = await reply_with_fault(gw.http_url, lambda: os.kill(proc.pid, signal.SIGSTOP))
        error = error_of(events)
        assert (error["code"], error["retryable"]) == ("tts_timeout", True)
        os.kill(proc.pid, signal.SIGCONT)
        reply = await sse_get(gw.http_url, {"text": "Thawed.", "format": "pcm"})
        assert "error" not in reply.names
        assert reply.one("audio_stream_end")["duration_s"] > 0
        assert await metric(gw, "gateway_errors_total", code="tts_timeout") == 1


async def test_a_name_that_stops_resolving(
    fake_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model server's DNS name goes away (a deleted Service, a DNS outage) and comes back:
    replies are refused or end with a retryable error meanwhile, and work again after."""
    real = socket.getaddrinfo
    resolvable = True

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("tts.voice.test", b"tts.voice.test"):  # (anyio asks with bytes)
            if not resolvable:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            host = "127.0.0.1"
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with gateway(f"http://tts.voice.test:{fake_server.port}", retry_attempts=2) as gw:
        assert "error" not in (await sse_get(gw.http_url, {"text": "Hi.", "format": "pcm"})).names
        resolvable = False
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=30) as http:
            r = await http.get("/v1/speak/sse", params={"text": "Hi.", "format": "pcm"})
        if r.status_code == 503:  # refused up front: no model server answers
            assert r.json()["error"]["code"] == "tts_unavailable"
            assert r.json()["error"]["retryable"] is True
        else:  # admitted on a kept-alive probe connection, then its session could not open
            events = list(SSEDecoder().push(r.content))
            assert orjson.loads(next(e.data for e in events if e.event == "error"))["retryable"]
        resolvable = True
        reply = await sse_get(gw.http_url, {"text": "Back.", "format": "pcm"})
        assert "error" not in reply.names


async def test_a_wedged_engine_call_fails_ping_until_it_ends(
    own_fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    """The watchdog: an engine call past --watchdog-s makes /ping (what SageMaker and the
    kubelet probe) and /load (what gateways route by) answer 503 stuck."""
    fake_engine.hold = True  # the call blocks until released
    scheduler = own_fake_server.app.state.service.get().synthesizer.scheduler
    real_clock = scheduler.clock
    async with (
        httpx.AsyncClient(base_url=own_fake_server.http_url) as http,
        connect(own_fake_server.ws_url + protocol.PATH) as ws,
    ):
        await ws.send(protocol.synthesize_message("Hello there.", "r1", None, 1.0, None))
        assert await asyncio.to_thread(fake_engine.entered.wait, 10)
        assert (await http.get("/ping")).status_code == 200  # running, not yet too long
        scheduler.clock = lambda: real_clock() + 61  # past the default 60 s
        try:
            ping, load = await http.get("/ping"), await http.get("/load")
            assert (ping.status_code, ping.json()["status"]) == (503, "stuck")
            assert "watchdog 60 s" in ping.json()["detail"]
            assert (load.status_code, load.json()["error"]["code"]) == (503, "stuck")
            fake_engine.gate.set()  # it comes loose
            while "synthesis_complete" not in str(await ws.recv()):
                pass
            # the clock still runs 61 s ahead: only the call's end can have cleared it
            ping, load = await http.get("/ping"), await http.get("/load")
            assert (ping.status_code, ping.json()["status"]) == (200, "ok")
            assert load.status_code == 200
        finally:
            scheduler.clock = real_clock


# --- the gateway restarted ----------------------------------------------------------------------


@pytest.mark.slow
async def test_sigterm_lets_the_reply_finish_then_closes_with_1012(
    fake_server: RunningServer,
) -> None:
    port = free_port()
    with gateway_process(port, fake_server.http_url) as proc:
        async with connect(f"ws://127.0.0.1:{port}/v1/speak/ws") as ws:
            await ws.send(orjson.dumps({"type": "speak", **PACED}).decode())
            events: list[str] = []

            async def listen() -> None:
                audio = 0
                while True:
                    frame = await ws.recv()
                    if isinstance(frame, bytes):
                        audio += 1
                        if audio == 1:
                            proc.send_signal(signal.SIGTERM)  # mid-reply
                        continue
                    events.append(orjson.loads(frame)["type"])

            with pytest.raises(ConnectionClosed) as closed:
                await listen()
        assert events[-1] == "agent_end"  # the reply finished
        assert "error" not in events
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1012  # then: service restart
        async with httpx.AsyncClient() as http:
            with pytest.raises(httpx.ConnectError):  # no longer listening
                await http.get(f"http://127.0.0.1:{port}/healthz")
        # done: uvicorn re-raises the SIGTERM it held, as a process stopped by it ends
        assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGTERM


@pytest.mark.slow
async def test_sigterm_while_idle_closes_at_once_and_new_sessions_are_refused(
    fake_server: RunningServer,
) -> None:
    port = free_port()
    with gateway_process(port, fake_server.http_url) as proc:
        async with connect(f"ws://127.0.0.1:{port}/v1/speak/ws") as ws:
            proc.send_signal(signal.SIGTERM)
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1012, "service restart")
        # done: uvicorn re-raises the SIGTERM it held, as a process stopped by it ends
        assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGTERM


# a service that tells who runs it: its interpreter and working directory
WHO_RUNS = """
import http.server, json, os, sys
class Who(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({"executable": sys.executable, "cwd": os.getcwd()}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Who).serve_forever()
"""


def test_the_process_helper_runs_this_interpreter() -> None:
    """`running` starts a service with the interpreter running the tests (so with this
    virtual environment's packages, not whatever `python` is on PATH), in the repository,
    ready once it answers; and stops and reaps it on the way out."""
    port = free_port()
    with running(["-c", WHO_RUNS, str(port)], f"http://127.0.0.1:{port}/") as proc:
        who = httpx.get(f"http://127.0.0.1:{port}/").json()
    assert who == {"executable": sys.executable, "cwd": str(ROOT)}
    assert proc.returncode is not None  # reaped
