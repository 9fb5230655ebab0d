"""The model-server transport's load probe (`ModelServerTransport.load`), its HTTP answered by
httpx's mock transport: the report parsed, asked on the probe client with the wait given, and
every way it can fail translated at the edge (a timeout apart from the rest, since the pool
treats a slow answer differently from a wrong one)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import orjson
import pytest

from gateway.errors import TTSError
from gateway.transports.model_server import LoadTimeout, ModelServerTransport
from kokoro_contract.load import LoadReport, MalformedLoadReport

REPORT = LoadReport(2, 1, 0, 0.4, None, 0.35, 0.028, first_window_s=0.2, inflight=1)
URL = "http://10.0.0.7:8080"


def probe_client(answer: Callable[[httpx.Request], httpx.Response]) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(answer), timeout=httpx.Timeout(0.5))


def never(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"asked on the synthesis client: {request.url}")


async def test_the_load_report_is_asked_on_the_probe_client_and_parsed() -> None:
    asked: list[tuple[str, float]] = []

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append((str(request.url), request.extensions["timeout"]["read"]))
        return httpx.Response(200, content=REPORT.encode())

    async with probe_client(never) as client, probe_client(answer) as probe:
        transport = ModelServerTransport(URL + "/", client, probe)
        assert await transport.load() == REPORT  # the probe client's own timeout
        assert await transport.load(2.0) == REPORT  # a longer one, asked for
    assert asked == [(URL + "/load", 0.5), (URL + "/load", 2.0)]


async def test_a_load_probe_with_no_answer_in_time_is_a_load_timeout() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer in time", request=request)

    async with probe_client(never) as client, probe_client(slow) as probe:
        with pytest.raises(LoadTimeout) as failed:
            await ModelServerTransport(URL, client, probe).load()
    assert isinstance(failed.value, TTSError)
    assert failed.value.message == "the model server did not report its load in time"
    assert failed.value.detail == f"model server at {URL}: /load: ReadTimeout: no answer in time"
    assert isinstance(failed.value.__cause__, httpx.ReadTimeout)


def unreachable(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


@pytest.mark.parametrize(
    ("answer", "cause"),
    [
        (unreachable, httpx.ConnectError),
        (lambda _: httpx.Response(502, content=b"<html>502</html>"), httpx.HTTPStatusError),
        (lambda _: httpx.Response(200, content=b"<html>502</html>"), MalformedLoadReport),
        (lambda _: httpx.Response(200, content=b"[]"), MalformedLoadReport),
        (
            lambda _: httpx.Response(200, content=orjson.dumps({"workers": 2})),
            MalformedLoadReport,
        ),
    ],
    ids=["unreachable", "error status", "not JSON", "not an object", "a field missing"],
)
async def test_a_load_probe_answered_wrongly_is_a_tts_error(
    answer: Callable[[httpx.Request], httpx.Response], cause: type[Exception]
) -> None:
    async with probe_client(never) as client, probe_client(answer) as probe:
        with pytest.raises(TTSError) as failed:
            await ModelServerTransport(URL, client, probe).load()
    assert not isinstance(failed.value, LoadTimeout)
    assert failed.value.message == "the model server did not report its load"
    assert str(failed.value.detail).startswith(f"model server at {URL}: /load: {cause.__name__}")
    assert isinstance(failed.value.__cause__, cause)
