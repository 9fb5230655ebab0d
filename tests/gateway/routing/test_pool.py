"""The model-server pool under faults, on real servers (the fake engine) behind a fault proxy:
a wedged server is marked down so new replies go to another, a name's addresses are followed
as they change, and the batch path fails over before its audio and never after. Which server
served a reply is read from the servers themselves (their engines' calls, the requests their
proxies saw), never inferred from timing."""

from __future__ import annotations

import base64
import contextlib
import socket
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
import pytest

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.errors import TTSError
from gateway.routing import pool
from gateway.routing.admission import Refusal
from gateway.transports.base import Piece
from tests.end_to_end.test_faults import PACED, reply_with_fault
from tests.support.fakes import FakeEngine, expected_pcm_bytes, paced_reply_bytes, serve_fake
from tests.support.fault_proxy import FaultProxy, fault_proxy
from tests.support.gateway_client import counted, sse_get, wait_for_metric
from tests.support.servers import RunningServer, free_port, serve

BIDI = "GET /invocations-bidirectional-stream"
BATCH = "POST /invocations"


def fake_model_server(
    engine: FakeEngine, host: str = "127.0.0.1", port: int = 0
) -> AbstractContextManager[RunningServer]:
    """A model server of its own over `engine`, at `host`:`port` (0: any free port); it takes
    as many pending requests per session as a real one (a resumed reply sends its unfinished
    chunks at once)."""
    return serve_fake(engine, host, port, max_pending=32)


def pool_of(gateway: RunningServer) -> pool.ModelServerPool:
    runtime_pool = gateway.app.state.service.runtime.pool
    assert isinstance(runtime_pool, pool.ModelServerPool)
    return runtime_pool


# --- a wedged server ----------------------------------------------------------------------------


@pytest.mark.slow
async def test_a_wedged_model_server_is_marked_down_so_new_replies_go_to_another() -> None:
    """A model server wedges mid-reply (no pings here: its chunk's due time notices it, as it
    would a server that answers pings but not requests): that reply resumes on the other
    server (`tts_timeout` after its audio had started), and the next reply goes straight to
    the other server, never to the wedged one, even though the wedged one's last load report
    (kept while its probes time out, for as long as `stale_load_s` allows: a long while here)
    still ranks it first."""
    engines = {"a": FakeEngine(), "b": FakeEngine()}
    with (
        fake_model_server(engines["a"]) as a,
        fake_model_server(engines["b"]) as b,
        fault_proxy(a.port) as proxy_a,
        fault_proxy(b.port) as proxy_b,
    ):
        proxies = {"a": proxy_a, "b": proxy_b}
        urls = f"{proxy_a.http_url},{proxy_b.http_url}"
        settings = GatewaySettings(
            model_server_url=urls,
            tts_timeout_s=1,
            stall_timeout_s=0,
            chunk_plan="sentences",  # chunks cut the same however loaded the machine is
        )
        with serve(create_gateway(settings)) as gw:
            pool_of(gw).stale_load_s = 600.0  # a timed-out probe alone never marks it down
            frozen: list[str] = []

            def freeze_the_one_speaking() -> None:
                (name,) = [n for n, p in proxies.items() if BIDI in p.requests]
                proxies[name].freeze()
                frozen.append(name)

            events = await reply_with_fault(gw.http_url, freeze_the_one_speaking)
            assert "error" not in [e.event for e in events]  # resumed on the other
            heard = sum(
                len(base64.b64decode(orjson.loads(e.data)["data"]))
                for e in events
                if e.event == "audio_chunk"
            )
            assert heard == paced_reply_bytes(PACED["text"])  # every segment once
            assert await counted(gw, "gateway_errors_total", code="tts_timeout") == 0
            (wedged,) = frozen
            (other,) = set(proxies) - {wedged}
            assert await wait_for_metric(gw, "gateway_active_sessions", 0, transport="sse") == 0

            text = "After the freeze."
            reply = await sse_get(gw.http_url, {"text": text, "format": "pcm"})
        assert "error" not in reply.names
        assert len(b"".join(reply.audio_chunks())) == expected_pcm_bytes(text)
        assert engines[other].calls[-1] == text  # served by the other one...
        assert proxies[other].requests.count(BIDI) == 2  # (the resumption, then this one)
        assert proxies[wedged].requests.count(BIDI) == 1  # ...and never tried on the frozen one
        assert text not in engines[wedged].calls


# --- a name whose addresses change --------------------------------------------------------------


async def test_the_pool_follows_a_name_whose_addresses_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The model server's name (a headless Service) resolves to one set of pods, then another:
    the pool re-resolves it, keeps what it knew of a pod that stays, drops a pod that left
    (new replies never go there, though it ranked first: it had learned it is fast) and sends
    them to one that came."""
    addresses = ["127.0.0.3", "127.0.0.4"]
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("tts.voice.test", b"tts.voice.test"):  # (anyio asks with bytes)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, int(port))) for a in addresses]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    engines = {host: FakeEngine() for host in ("127.0.0.2", "127.0.0.3", "127.0.0.4")}
    port = free_port()
    with contextlib.ExitStack() as stack:
        for host, engine in engines.items():
            stack.enter_context(fake_model_server(engine, host, port))
        settings = GatewaySettings(model_server_url=f"http://tts.voice.test:{port}")
        gw = stack.enter_context(serve(create_gateway(settings)))
        servers = pool_of(gw)
        servers.resolve_every_s = 0.0  # every new reply resolves the name again

        def pods() -> list[str]:
            return sorted(urlsplit(u.url).hostname or "" for u in servers.upstreams)

        one = await sse_get(gw.http_url, {"text": "One.", "format": "pcm"})
        assert pods() == ["127.0.0.3", "127.0.0.4"]
        # equal loads: the first name serves, and learns how fast its engine is
        assert [e.calls for e in engines.values()] == [[], ["One."], []]
        stays = next(u for u in servers.upstreams if "127.0.0.4" in u.url)

        addresses[:] = ["127.0.0.2", "127.0.0.4"]  # .3 left, .2 came
        two = await sse_get(gw.http_url, {"text": "Two.", "format": "pcm"})
        assert pods() == ["127.0.0.2", "127.0.0.4"]
        assert next(u for u in servers.upstreams if "127.0.0.4" in u.url) is stays
        assert [e.calls for e in engines.values()] == [["Two."], ["One."], []]
    for reply, text in ((one, "One."), (two, "Two.")):
        assert "error" not in reply.names
        assert len(b"".join(reply.audio_chunks())) == expected_pcm_bytes(text)


# --- the batch path -----------------------------------------------------------------------------

TWO = "The first sentence is here. And this is the second one."
SENTENCES = ["The first sentence is here.", "And this is the second one."]
WHOLE = sum(expected_pcm_bytes(s) for s in SENTENCES)


@contextlib.asynccontextmanager
async def batch_pool(
    first: FaultProxy, then: RunningServer
) -> AsyncIterator[tuple[pool.PooledTransport, pool.Upstream, pool.Upstream]]:
    """A reply's transport in a pool of two servers that are both up, the one behind `first`
    chosen (then: its upstream, and the other's)."""
    async with httpx.AsyncClient() as client:
        servers = pool.ModelServerPool([first.http_url, then.http_url], client)
        try:
            assert isinstance(await servers.pick(None), pool.Upstream)  # both answer /load
            by_url = {u.url: u for u in servers.upstreams}
            chosen, other = by_url[first.http_url], by_url[then.http_url]
            assert chosen.up
            assert other.up
            transport = servers.transport_for(chosen)
            yield transport, chosen, other
            transport.release()
        finally:
            await servers.aclose()


async def collect(pieces: AsyncIterator[Piece], heard: list[bytes]) -> bytes:
    """The PCM of a batch call, each piece into `heard` as it comes."""
    async for piece in pieces:
        assert isinstance(piece, bytes)
        heard.append(piece)
    return b"".join(heard)


async def test_a_batch_call_fails_over_to_another_server_before_any_audio() -> None:
    engines = {"chosen": FakeEngine(), "other": FakeEngine()}
    with (
        fake_model_server(engines["chosen"]) as chosen_server,
        fake_model_server(engines["other"]) as other_server,
        fault_proxy(chosen_server.port) as proxy,
    ):
        proxy.cut(BATCH.encode(), after=0)  # its connection closes before the server hears it
        async with batch_pool(proxy, other_server) as (transport, chosen, other):
            pcm = await collect(transport.synthesize(TWO, None, 1.0), [])
            # the reply counts where it is served now
            assert transport.upstream is other
            assert (chosen.replies, other.replies) == (0, 1)
        assert not chosen.up  # skipped by new replies until tried again
    assert proxy.requests.count(BATCH) == 1
    assert engines["chosen"].calls == []
    assert engines["other"].calls == SENTENCES
    assert len(pcm) == WHOLE  # all of it, once


async def test_a_batch_call_is_never_retried_after_its_audio_has_started() -> None:
    engines = {"chosen": FakeEngine(), "other": FakeEngine()}
    with (
        fake_model_server(engines["chosen"]) as chosen_server,
        fake_model_server(engines["other"]) as other_server,
        fault_proxy(chosen_server.port) as proxy,
    ):
        proxy.cut(BATCH.encode(), after=4_000)  # the headers and some audio, then it ends
        heard: list[bytes] = []
        async with batch_pool(proxy, other_server) as (transport, chosen, _):
            with pytest.raises(TTSError) as failed:
                await collect(transport.synthesize(TWO, None, 1.0), heard)
            assert transport.upstream is chosen  # it stayed where its audio came from
        pcm = b"".join(heard)
    assert failed.value.retryable  # the caller may try again; the pool did not, silently
    assert failed.value.message == "the model server's stream failed"  # not where it is:
    assert f"model server at {proxy.http_url} failed" in str(failed.value.detail)  # the log's
    assert 0 < len(pcm) < WHOLE  # what was heard: cut short, not repeated from elsewhere
    assert engines["chosen"].calls[:1] == SENTENCES[:1]
    assert engines["other"].calls == []


# --- a load answer that says no load -------------------------------------------------------------


async def test_a_server_whose_load_answer_says_no_load_is_down() -> None:
    """A `/load` body that is no load report (a proxy's error page, a JSON list, a field that
    is not a number) marks its server down, as one that cannot be reached: a new reply is
    refused `tts_unavailable`; once `down_for_s` has passed it is asked again, and a good
    answer serves (the answers come from the probe client's transport)."""
    good = {"workers": 2, "busy": 0, "waiting": 0, "backlog_s": 0.0, "min_slack_s": None}
    good |= {"seconds_per_call": 0.35, "seconds_per_phoneme": 0.028}
    bodies = [b"<html>502 Bad Gateway</html>", b"[]", orjson.dumps(good | {"busy": "many"})]
    bodies.append(orjson.dumps(good))

    def load(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=bodies.pop(0))

    url = "http://127.0.0.1:9"  # never dialled: the probe client answers
    async with httpx.AsyncClient() as client:
        probe = httpx.AsyncClient(transport=httpx.MockTransport(load))
        servers = pool.ModelServerPool([url], client, probe=probe, down_for_s=0.0)
        try:
            for _ in range(3):
                refused = await servers.pick(3.0)
                assert isinstance(refused, Refusal)
                assert refused.code == "tts_unavailable"
            served = await servers.pick(3.0)
        finally:
            await servers.aclose()
    assert isinstance(served, pool.Upstream)
    assert served.load is not None
    assert served.load.workers == 2
    assert bodies == []


# --- voices, with no load to go on ----------------------------------------------------------------


async def test_voices_come_from_a_server_whose_load_probe_times_out() -> None:
    """The page's voice picker asks no load: a model server whose every `/load` probe times
    out (a fault in the probe client's transport) still gives its voices, and the first server
    that answers does when another is gone; new replies, which need a load, are refused."""

    def no_load(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer in time", request=request)

    gone = f"http://127.0.0.1:{free_port()}"
    with fake_model_server(FakeEngine()) as server:
        settings = GatewaySettings(model_server_url=f"{gone},{server.http_url}")
        with serve(create_gateway(settings)) as gw:
            servers = pool_of(gw)
            await servers.probe.aclose()
            servers.probe = httpx.AsyncClient(transport=httpx.MockTransport(no_load))
            async with httpx.AsyncClient(base_url=gw.http_url) as http:
                voices = await http.get("/v1/voices")
                refused = await http.get("/v1/speak/sse", params={"text": "Hi.", "format": "pcm"})
    assert voices.status_code == 200
    assert [v["name"] for v in voices.json()["voices"]] == ["af_test", "jf_alpha"]
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "tts_unavailable"


async def test_voices_stay_listed_while_the_server_that_gave_them_is_gone() -> None:
    """A page opened while the model server is away (a restart, a moment's overload) still
    gets the voices it last listed; speaking then is the clear refusal."""
    port = free_port()
    settings = GatewaySettings(model_server_url=f"http://127.0.0.1:{port}")
    with serve(create_gateway(settings)) as gw:
        catalog = gw.app.state.service.replies.voices
        async with httpx.AsyncClient(base_url=gw.http_url) as http:
            with fake_model_server(FakeEngine(), port=port):
                listed = await http.get("/v1/voices")
            catalog.refresh_s = 0.0  # ask again at once: the server is gone now
            again = await http.get("/v1/voices")
            refused = await http.get("/v1/speak/sse", params={"text": "Hi.", "format": "pcm"})
    assert listed.status_code == again.status_code == 200
    assert [v["name"] for v in listed.json()["voices"]] == ["af_test", "jf_alpha"]
    assert again.json() == listed.json()
    assert (refused.status_code, refused.json()["error"]["code"]) == (503, "tts_unavailable")


async def test_voices_from_no_server_that_answers_are_a_clear_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client is told the model server is unreachable, never where it is: its address
    goes to the gateway's log only."""
    gone = f"http://127.0.0.1:{free_port()}"
    with serve(create_gateway(GatewaySettings(model_server_url=gone))) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url) as http:
            failed = await http.get("/v1/voices")
            assert (await http.get("/v1/voices")).json() == failed.json()  # asked again
    assert failed.status_code == 502
    assert failed.json()["error"] == {
        "code": "tts_error",
        "message": "the model server is unreachable",
        "retryable": True,
    }
    assert gone not in failed.text
    logged = [r.getMessage() for r in caplog.records if r.name == "kokoro_contract.http_errors"]
    assert len(logged) == 2
    assert all(
        m.startswith(f"GET /v1/voices: model server at {gone} unreachable: ConnectError")
        for m in logged
    )
