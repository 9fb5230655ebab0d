"""One record, one line: what a client sends cannot forge a log line or drive a terminal."""

from __future__ import annotations

import io
import logging

import httpx

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from kokoro_contract.logs import FORMAT, OneLineFormatter, ProbeFilter, printable
from tests.support.servers import RunningServer, serve


def test_printable_escapes_what_a_terminal_acts_on() -> None:
    assert printable("GET /v1/speak/sse 200") == "GET /v1/speak/sse 200"
    assert printable("a\nb\r\x1b[31mc\x00") == "a\\x0ab\\x0d\\x1b[31mc\\x00"
    assert printable("x\u2028y\u202ez") == "x\\u2028y\\u202ez"  # line separator, bidi override
    assert printable("été ☃") == "été ☃"  # printable text stays as it is


async def test_a_planted_newline_and_escape_stay_on_the_request_line(
    fake_server: RunningServer,
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(OneLineFormatter(FORMAT))
    logger = logging.getLogger("gateway")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    forged = "/v1/speak/sse%0A2026-12-01 00:00:00 INFO gateway: GET /admin 200%1b[2J"
    try:
        with serve(create_gateway(GatewaySettings(model_server_url=fake_server.http_url))) as gw:
            async with httpx.AsyncClient(base_url=gw.http_url) as client:
                response = await client.get(forged)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert response.status_code == 404
    lines = [line for line in stream.getvalue().splitlines() if "/v1/speak/sse" in line]
    assert len(lines) == 1, lines
    (line,) = lines
    assert "\x1b" not in stream.getvalue()
    assert "/v1/speak/sse\\x0a2026-12-01 00:00:00 INFO gateway: GET /admin 200\\x1b[2J 404" in line
    assert not any(s.startswith("2026-12-01 00:00:00 INFO") for s in stream.getvalue().splitlines())


def uvicorn_access(path: str, status: int) -> logging.LogRecord:
    """A record as uvicorn's access logger makes it."""
    args = ("127.0.0.1:5000", "GET", path, "1.1", status)
    return logging.LogRecord(
        "uvicorn.access", logging.INFO, "h11_impl.py", 1, '%s - "%s %s HTTP/%s" %d', args, None
    )


def test_probe_answers_are_logged_when_they_change() -> None:
    probes = ProbeFilter({"/ping"})
    answers = [503] * 12 + [200] * 30 + [503, 200]  # loading, then healthy, one blip
    logged = [s for s in answers if probes.filter(uvicorn_access("/ping", s))]
    assert logged == [503, 200, 503, 200]
    assert all(probes.filter(uvicorn_access("/invocations", 200)) for _ in range(3))


def test_the_model_servers_access_log_keeps_probes_quiet() -> None:
    from model_server import cli

    access = logging.getLogger("uvicorn.access")
    before = access.filters[:]
    try:
        cli.quiet_probes()
        passed = [bool(access.filter(uvicorn_access("/ping", 503))) for _ in range(5)]
        passed += [bool(access.filter(uvicorn_access("/load", 200))) for _ in range(5)]
        assert passed == [True, False, False, False, False, True, False, False, False, False]
        assert access.filter(uvicorn_access("/invocations", 200))
    finally:
        access.filters[:] = before


async def test_the_gateways_request_log_keeps_probes_quiet(fake_server: RunningServer) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("gateway")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with serve(create_gateway(GatewaySettings(model_server_url=fake_server.http_url))) as gw:
            async with httpx.AsyncClient(base_url=gw.http_url) as client:
                for _ in range(4):
                    assert (await client.get("/healthz")).status_code == 200
                for _ in range(2):
                    assert (await client.get("/v1/voices")).status_code == 200
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = stream.getvalue().splitlines()
    assert len([s for s in lines if s.startswith("GET /healthz 200")]) == 1
    assert len([s for s in lines if s.startswith("GET /v1/voices 200")]) == 2
