"""Gateway edge cases: barge-in, bad input on every route, origins, LLM source, failures."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.sources.sse import SSEDecoder
from model_server.drain import wait_drained
from tests.support.fakes import FailingEngine, FakeEngine, expected_pcm_bytes, serve_fake
from tests.support.gateway_client import metric, split_audio_frame, sse_get, sse_post
from tests.support.openai_stub import create_stub, llm_gateway_settings
from tests.support.servers import RunningServer, serve

ANSWER = ["Sure", ", here", " is", " the", " answer", " you", " asked", " for.", " Bye", " now."]


async def model_server_inflight(server: RunningServer) -> int:
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        return int((await http.get("/ping")).json()["inflight"])


async def recv_event(ws: object, kinds: set[str]) -> dict[str, object]:
    """Next JSON event of one of `kinds`, skipping audio and other events."""
    while True:
        frame = await ws.recv()  # type: ignore[attr-defined]
        if isinstance(frame, bytes):
            continue
        event: dict[str, object] = orjson.loads(frame)
        if event["type"] in kinds:
            return event


async def test_barge_in_cancels_down_to_the_model_server(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    cancels_before = await metric(gateway_on_fake, "gateway_cancels_total")
    fake_engine.hold = True
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        text = "A long reply that keeps going. " * 6
        await ws.send(orjson.dumps({"type": "speak", "text": text, "format": "mp3"}).decode())
        await recv_event(ws, {"audio_stream_start"})
        await asyncio.to_thread(fake_engine.entered.wait, 10)  # synthesis is running now
        await ws.send('{"type": "cancel"}')
        cancelled = await recv_event(ws, {"cancelled", "agent_end"})
        assert cancelled["type"] == "cancelled"  # no agent_end: the reply stopped
        assert await asyncio.to_thread(fake_engine.cancel_seen.wait, 10)
        assert fake_engine.cancelled  # the in-flight engine call was aborted
        fake_engine.hold = False
        # the connection is still usable, and no audio of the cancelled utterance follows
        await ws.send(
            '{"type": "speak", "text": "Next one.", "format": "pcm", "utterance_id": "n"}'
        )
        owners = set()
        while True:
            frame = await ws.recv()
            if isinstance(frame, bytes):
                owners.add(split_audio_frame(frame)[0])
                continue
            event = orjson.loads(frame)
            assert event["utterance_id"] == "n"
            if event["type"] == "agent_end":
                break
        assert owners == {"n"}
    assert await metric(gateway_on_fake, "gateway_cancels_total") == cancels_before + 1


@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_a_listener_leaving_an_sse_reply_closes_its_model_server_session(
    own_fake_server: RunningServer, method: str
) -> None:
    """The browser goes away after its first audio while the LLM is still writing: the
    gateway's session to the model server must end with it, not linger until the reply would
    have ended (the model server's drain would wait for it on every pod stop)."""
    app = create_gateway(GatewaySettings(model_server_url=own_fake_server.http_url))
    text = "First words here. " + "Then more text, slowly. " * 30
    # about 40 s of text still to come when the first audio arrives
    params = {"text": text, "format": "pcm", "mode": "bidi", "echo_tps": "4"}
    with serve(app) as gateway:
        async with httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http:
            request = (
                http.build_request("GET", "/v1/speak/sse", params=params)
                if method == "GET"
                else http.build_request("POST", "/v1/speak", json=params)
            )
            response = await http.send(request, stream=True)
            decoder = SSEDecoder()
            # held by name: an iterator left behind is closed when it is collected, and the
            # response with it, so the listener would leave before the count below
            chunks = response.aiter_raw()
            async for raw in chunks:
                if any(e.event == "audio_chunk" for e in decoder.push(raw)):
                    break
            assert await model_server_inflight(own_fake_server) == 1  # the reply's session
            await response.aclose()  # the listener leaves mid-reply
        # the production drain hook's own wait: returns at once when nothing is in flight
        assert await asyncio.to_thread(wait_drained, own_fake_server.http_url, 10, 0.02) == 0


@pytest.mark.parametrize(
    ("params", "code"),
    [
        ({}, "missing_text"),
        ({"text": ""}, "empty_text"),
        ({"text": "Hi.", "format": "aiff"}, "invalid_field"),
        ({"text": "Hi.", "mode": "turbo"}, "invalid_field"),
        ({"text": "Hi.", "speed": "3"}, "invalid_field"),
        ({"text": "Hi.", "prompt": "Hi?"}, "invalid_field"),
        ({"text": "Hi.", "colour": "blue"}, "invalid_field"),
        ({"text": "Hi.", "utterance_id": "é"}, "invalid_field"),  # goes into a header
        ({"text": "Hi.", "echo_tps": "1e-9"}, "invalid_field"),  # hours for one reply
        ({"text": "Hi.", "echo_first_ms": "60000"}, "invalid_field"),
        ({"text": "x" * 5001}, "text_too_long"),
    ],
)
async def test_sse_bad_input(
    gateway_on_fake: RunningServer, params: dict[str, str], code: str
) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        got = await http.get("/v1/speak/sse", params=params)
        posted = await http.post("/v1/speak", json=params)
    for r in (got, posted):
        assert r.status_code == 400
        assert r.json()["error"]["code"] == code
        assert r.json()["error"]["message"]


async def test_post_body_must_be_a_json_object(gateway_on_fake: RunningServer) -> None:
    json = {"Content-Type": "application/json"}
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, headers=json) as http:
        bad = await http.post("/v1/speak", content=b"{nope")
        arr = await http.post("/v1/speak", content=b"[1]")
    assert (bad.status_code, bad.json()["error"]["code"]) == (400, "invalid_json")
    assert (arr.status_code, arr.json()["error"]["code"]) == (400, "not_an_object")


async def test_eventsource_reconnect_gets_204(gateway_on_fake: RunningServer) -> None:
    reply = await sse_get(gateway_on_fake.http_url, {"text": "Hi there.", "format": "pcm"})
    last_id = reply.events[-1].id
    assert last_id
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        again = await http.get(
            "/v1/speak/sse",
            params={"text": "Hi there.", "format": "pcm"},
            headers={"Last-Event-ID": last_id},
        )
    assert again.status_code == 204
    assert again.content == b""


async def test_tts_error_ends_the_reply_with_an_error_event(fake_server: RunningServer) -> None:
    """A model server that refuses a chunk mid-reply: here a voice it no longer has while the
    gateway's catalog, between two refreshes, still lists it."""
    with serve(create_gateway(GatewaySettings(model_server_url=fake_server.http_url))) as gw:
        catalog = gw.app.state.service.replies.voices
        catalog._known, catalog._asked_at = frozenset({"nobody", "af_test"}), float("inf")
        reply = await sse_post(gw.http_url, {"text": "Hi there.", "voice": "nobody"})
        assert reply.names[-2:] == ["error", "agent_end"]
        error = reply.one("error")
        assert error["code"] == "tts_unknown_voice"
        assert "nobody" in error["message"]
        # the next request works
        ok = await sse_post(gw.http_url, {"text": "Hi there.", "format": "pcm"})
        assert "error" not in ok.names


FAILED_ON_THE_WIRE = {
    # the session's error frame names the error: the client reads its code
    "bidi": ("tts_synthesis_failed", "the model server answered synthesis_failed"),
    # a streamed POST /invocations has sent its 200 when the engine fails: the model server
    # cuts the stream, which the gateway reads as broken (tried again: it never had audio)
    "batch": ("tts_error", "the model server's stream failed"),
}


@pytest.mark.parametrize("mode", ["bidi", "batch"])
async def test_a_model_server_failing_in_itself_tells_the_client_no_more_than_that(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The model server's error about itself (its engine's exception, a file's path) reaches the
    client as a code and a plain message, never a short answer that looks whole; what failed,
    only the logs. (An error about the request, an unknown voice, keeps its message: above.)"""
    with (
        caplog.at_level(logging.WARNING),
        serve_fake(engine := FailingEngine()) as server,
        serve(create_gateway(GatewaySettings(model_server_url=server.http_url))) as gw,
    ):
        reply = await sse_post(gw.http_url, {"text": "Hi there.", "format": "pcm", "mode": mode})
    assert reply.names[-3:] == ["audio_stream_end", "error", "agent_end"]
    assert not reply.audio_chunks()
    error = reply.one("error")
    assert (error["code"], error["message"]) == FAILED_ON_THE_WIRE[mode]
    assert "/opt/ml" not in str(reply.events)
    said = FailingEngine.failure
    logged = [r.getMessage() for r in caplog.records if r.name == "gateway.reply.pipeline"]
    (line,) = logged
    if mode == "bidi":
        assert line.endswith(f": model server: {said}")
    else:
        assert line.endswith(
            "failed: RemoteProtocolError: peer closed connection without sending complete"
            " message body"
            " (incomplete chunked read)"
        )
        cut = [r.getMessage() for r in caplog.records if r.name == "model_server.routes.http"]
        assert len(cut) == len(engine.calls)  # each try cut, none answered short
        assert all(m.endswith(f" cut short: {said}") for m in cut)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]  # and no traceback


async def test_openai_speech_failing_after_its_headers_is_cut_not_ended_short(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`/v1/audio/speech` has sent its 200 when the model server fails on the second chunk: the
    OpenAI SDK reads the first chunk's audio, then a broken stream, never a short file that
    looks whole (an SSE `stream_format` says `error` instead)."""
    engine = FailingEngine(fails_on="second")
    text = "This is the first sentence here, said in full. And this is the second one here."
    with (
        caplog.at_level(logging.WARNING, "gateway"),
        serve_fake(engine) as server,
        serve(create_gateway(GatewaySettings(model_server_url=server.http_url))) as gw,
    ):
        client = openai.AsyncOpenAI(base_url=gw.http_url + "/v1", api_key="unused")
        heard = bytearray()
        # (the SDK brings an httpx of its own, whose RemoteProtocolError this is)
        with pytest.raises(Exception, match="incomplete chunked read"):
            await read_speech(client, text, heard)
        await client.close()
    first, second = engine.calls
    assert "second" in second
    assert len(heard) == expected_pcm_bytes(first)
    cut = [r.getMessage() for r in caplog.records if "cut short" in r.getMessage()]
    assert [m.split(": ", 1)[1] for m in cut] == [
        "tts_synthesis_failed (the model server answered synthesis_failed)"
    ]


async def read_speech(client: openai.AsyncOpenAI, text: str, into: bytearray) -> None:
    async with client.audio.speech.with_streaming_response.create(
        model="kokoro", voice="af_test", input=text, response_format="pcm"
    ) as response:
        async for part in response.iter_bytes():
            into += part


async def test_websocket_bad_input_keeps_the_session(gateway_on_fake: RunningServer) -> None:
    bad = [
        ("{nope", "invalid_json"),
        ("[1]", "not_an_object"),
        ('{"type": "dance"}', "unknown_type"),
        ('{"type": "speak", "text": "Hi.", "speed": 9}', "invalid_field"),
        ('{"type": "speak", "text": "   "}', "empty_text"),
        ('{"type": "text", "delta": "orphan"}', "no_open_utterance"),
        ('{"type": "flush"}', "no_open_utterance"),
        ('{"type": "cancel"}', "nothing_to_cancel"),
    ]
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        for frame, code in bad:
            await ws.send(frame)
            error = orjson.loads(await ws.recv())
            assert (error["type"], error["code"]) == ("error", code), frame
        await ws.send(b"\x00binary")
        assert orjson.loads(await ws.recv())["code"] == "binary_frame"
        await ws.send('{"type": "speak", "format": "pcm"}')  # client text, not yet flushed
        await ws.send('{"type": "speak", "text": "Hi."}')
        assert orjson.loads(await recv_event_raw(ws))["code"] == "busy"
        await ws.send('{"type": "text", "delta": "Now it works."}')
        await ws.send('{"type": "flush"}')
        end = await recv_event(ws, {"agent_end"})
        assert end["type"] == "agent_end"
        await ws.send('{"type": "close"}')
        await ws.wait_closed()
        assert ws.close_code == 1000


async def recv_event_raw(ws: object) -> str:
    while True:
        frame = await ws.recv()  # type: ignore[attr-defined]
        if isinstance(frame, str) and '"error"' in frame:
            return frame


async def test_websocket_origin_allowlist(gateway_on_fake: RunningServer) -> None:
    url = gateway_on_fake.ws_url + "/v1/speak/ws"
    async with connect(url, origin="http://localhost:5173") as ws:  # type: ignore[arg-type]
        await ws.send('{"type": "cancel"}')
        assert orjson.loads(await ws.recv())["code"] == "nothing_to_cancel"
    with pytest.raises(InvalidStatus) as denied:
        async with connect(url, origin="https://evil.example"):  # type: ignore[arg-type]
            pass
    assert denied.value.response.status_code == 403


async def test_cors(gateway_on_fake: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        headers = {"Origin": "http://127.0.0.1:3000", "Access-Control-Request-Method": "POST"}
        ok = await http.options("/v1/speak", headers=headers)
        evil = await http.options(
            "/v1/speak", headers={**headers, "Origin": "https://evil.example"}
        )
    assert ok.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"
    assert "access-control-allow-origin" not in evil.headers


async def test_openai_speech_bad_input(gateway_on_fake: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        cases = [
            ({"model": "kokoro", "voice": "alloy"}, "invalid_field"),
            ({"input": "Hi.", "response_format": "ogg"}, "invalid_field"),
            ({"input": "Hi.", "speed": 4.0}, "invalid_field"),
            ({"input": "x" * 5001}, "text_too_long"),
        ]
        for body, code in cases:
            r = await http.post("/v1/audio/speech", json=body)
            assert (r.status_code, r.json()["error"]["code"]) == (400, code), body


@pytest.fixture
def openai_stub() -> Iterator[RunningServer]:
    with serve(create_stub(ANSWER)) as running:
        yield running


@pytest.fixture
def gateway_with_llm(
    fake_server: RunningServer, openai_stub: RunningServer
) -> Iterator[RunningServer]:
    settings = llm_gateway_settings(fake_server.http_url, openai_stub.http_url)
    with serve(create_gateway(settings)) as running:
        yield running


async def test_prompt_streams_from_an_openai_compatible_llm(
    gateway_with_llm: RunningServer, openai_stub: RunningServer
) -> None:
    reply = await sse_get(gateway_with_llm.http_url, {"prompt": "Tell me.", "format": "pcm"})
    assert [d["text"] for d in reply.data("text_delta")] == ANSWER
    assert reply.one("agent_end")["metrics"]["chunks"] >= 2
    assert reply.one("audio_stream_end")["duration_s"] > 0
    (request,) = openai_stub.app.state.requests
    assert request["model"] == "stub-model"
    assert request["messages"][-1] == {"role": "user", "content": "Tell me."}
    assert request["messages"][0]["role"] == "system"
    settings = gateway_with_llm.app.state.service.settings
    assert (request["max_tokens"], request["temperature"]) == (512, settings.temperature)


async def test_websocket_keeps_conversation_history(
    gateway_with_llm: RunningServer, openai_stub: RunningServer
) -> None:
    async with connect(gateway_with_llm.ws_url + "/v1/speak/ws") as ws:
        for prompt in ("First question?", "Second question?"):
            await ws.send(orjson.dumps({"type": "speak", "prompt": prompt}).decode())
            await recv_event(ws, {"agent_end"})
    first, second = openai_stub.app.state.requests
    assert second["messages"][1:] == [
        {"role": "user", "content": "First question?"},
        {"role": "assistant", "content": "".join(ANSWER)},
        {"role": "user", "content": "Second question?"},
    ]
    assert len(first["messages"]) == 2


async def test_an_overloaded_llm_is_retried_before_its_first_token(
    fake_server: RunningServer,
) -> None:
    with serve(create_stub(ANSWER, fail_first=2)) as llm:
        settings = llm_gateway_settings(fake_server.http_url, llm.http_url)
        with serve(create_gateway(settings)) as gw:
            reply = await sse_get(gw.http_url, {"prompt": "Tell me.", "format": "pcm"})
            assert "error" not in reply.names
            assert [d["text"] for d in reply.data("text_delta")] == ANSWER
            assert len(llm.app.state.requests) == 3
            assert await metric(gw, "gateway_retries_total", hop="llm") == 2


async def test_an_llm_that_stalls_mid_answer_ends_the_reply(fake_server: RunningServer) -> None:
    with serve(create_stub(ANSWER, stall_after=3)) as llm:
        settings = llm_gateway_settings(fake_server.http_url, llm.http_url, llm_timeout_s=0.5)
        with serve(create_gateway(settings)) as gw:
            reply = await sse_get(gw.http_url, {"prompt": "Tell me.", "format": "pcm"})
    assert [d["text"] for d in reply.data("text_delta")] == ANSWER[:3]
    assert reply.names[-2:] == ["error", "agent_end"]
    assert (reply.one("error")["code"], reply.one("error")["retryable"]) == ("llm_timeout", True)
    assert llm.app.state.stalled.is_set()


async def test_llm_failure_is_an_error_event_without_its_address(
    fake_server: RunningServer, openai_stub: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = llm_gateway_settings(
        fake_server.http_url, openai_stub.http_url, openai_model="missing-model"
    )
    with caplog.at_level(logging.WARNING, "gateway"), serve(create_gateway(settings)) as gw:
        reply = await sse_get(gw.http_url, {"prompt": "Hi?"})
    assert reply.names[-2:] == ["error", "agent_end"]
    error = reply.one("error")
    assert (error["code"], error["message"]) == ("llm_error", "the LLM answered 404")
    address = openai_stub.http_url.removeprefix("http://")
    assert address not in orjson.dumps(reply.data("error")).decode()
    logged = [r.getMessage() for r in caplog.records if "answered 404" in r.getMessage()]
    assert any(address in m and "model not found" in m for m in logged), logged  # the operator's


async def test_readyz_without_a_model_server() -> None:
    settings = GatewaySettings(model_server_url="http://127.0.0.1:9")  # nothing listens there
    with serve(create_gateway(settings)) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url) as http:
            ready = await http.get("/readyz")
            assert (await http.get("/healthz")).status_code == 200
            refused = await http.get("/v1/speak/sse", params={"text": "Hi."})
    assert ready.status_code == 503
    # refused before the stream starts, with when to try again
    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "tts_unavailable"
    assert refused.json()["error"]["retryable"] is True
    assert int(refused.headers["retry-after"]) >= 1
