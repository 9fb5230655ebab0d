"""Protocol edge cases through the real app and routes, over a fast controllable engine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from model_server.app import create_app
from model_server.config import Settings
from model_server.text.normalize import normalize
from model_server.text.split import split_phonemes
from tests.support.fakes import FAKE_SETTINGS, FakeEngine, expected_pcm_bytes, identity_g2p
from tests.support.model_server_client import read_until_terminal, synth
from tests.support.servers import RunningServer, serve

BIDI = "/invocations-bidirectional-stream"


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"\xc3\x28 not utf-8", "invalid_utf8"),
        ("{not json", "invalid_json"),
        ("[1, 2, 3]", "not_an_object"),
        ('{"voice": "jf_alpha"}', "missing_text"),
        ('{"text": ""}', "empty_text"),
        ('{"text": "' + "x" * (FAKE_SETTINGS.max_text_chars + 1) + '"}', "text_too_long"),
        ('{"text": "Hi.", "voice": "af_heart"}', "unknown_voice"),
        ('{"text": "Hi.", "speed": 3.5}', "invalid_speed"),
        ('{"type": "sing", "text": "Hi."}', "unknown_type"),
    ],
)
async def test_bad_input_answers_an_error_and_the_session_stays(
    fake_server: RunningServer, frame: str | bytes, code: str
) -> None:
    async with connect(fake_server.ws_url + BIDI) as ws:
        await ws.send(frame)
        error = orjson.loads(await ws.recv())
        assert error["type"] == "error"
        assert error["code"] == code
        assert error["message"]
        assert "Traceback" not in error["message"]
        await ws.send(synth("Still works.", "after"))
        reply = await read_until_terminal(ws, "after")
        assert reply.types == ["synthesis_start", "synthesis_complete"]
        assert len(reply.pcm) == expected_pcm_bytes("Still works.")


async def test_error_for_a_bad_request_carries_its_id(fake_server: RunningServer) -> None:
    async with connect(fake_server.ws_url + BIDI) as ws:
        await ws.send('{"text": "Hi.", "voice": "nobody", "request_id": "r7"}')
        error = orjson.loads(await ws.recv())
        assert (error["code"], error["request_id"]) == ("unknown_voice", "r7")
        assert "jf_alpha" in error["message"]  # says which voices exist


async def test_audio_length_follows_the_engine_exactly(fake_server: RunningServer) -> None:
    async with connect(fake_server.ws_url + BIDI) as ws:
        await ws.send(synth("One. Two two.", "r", speed=2))
        reply = await read_until_terminal(ws, "r")
    # two sentences, two segments, each with its own pause
    assert reply.frames == 2
    expected = expected_pcm_bytes("One.", 2.0) + expected_pcm_bytes("Two two.", 2.0)
    assert len(reply.pcm) == expected == reply.last["audio_bytes"]


async def test_cancel_in_flight_aborts_the_engine_call(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    fake_engine.hold = True
    async with connect(fake_server.ws_url + BIDI) as ws:
        await ws.send(synth("Held in the engine.", "held"))
        assert orjson.loads(await ws.recv())["type"] == "synthesis_start"
        await asyncio.to_thread(fake_engine.entered.wait, 10)
        await ws.send('{"type": "cancel", "request_id": "held"}')
        reply = await read_until_terminal(ws, "held")
        assert reply.last == {"type": "synthesis_cancelled", "request_id": "held"}
        assert reply.pcm == b""
        assert fake_engine.cancelled == ["Held in the engine."]


async def test_cancel_a_queued_request_and_cancel_all(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    fake_engine.hold = True
    async with connect(fake_server.ws_url + BIDI) as ws:
        for rid in ("a", "b", "c"):
            await ws.send(synth(f"Request {rid}.", rid))
        assert orjson.loads(await ws.recv()) == {"type": "synthesis_start", "request_id": "a"}
        await ws.send('{"type": "cancel", "request_id": "b"}')
        assert orjson.loads(await ws.recv()) == {"type": "synthesis_cancelled", "request_id": "b"}
        await ws.send('{"type": "cancel"}')  # everything: queued c, then in-flight a
        got = [orjson.loads(await ws.recv()) for _ in range(2)]
        assert {(e["type"], e["request_id"]) for e in got} == {
            ("synthesis_cancelled", "a"),
            ("synthesis_cancelled", "c"),
        }
        await ws.send('{"type": "cancel", "request_id": "a"}')
        late = orjson.loads(await ws.recv())
        assert (late["type"], late["code"]) == ("error", "unknown_request_id")
        fake_engine.hold = False
        await ws.send(synth("Fresh.", "d"))
        assert (await read_until_terminal(ws, "d")).last["type"] == "synthesis_complete"
    assert "Request b." not in fake_engine.calls
    assert "Request c." not in fake_engine.calls


async def test_duplicate_and_too_many_pending(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    fake_engine.hold = True
    async with connect(fake_server.ws_url + BIDI) as ws:
        for i in range(4):  # max_pending is 4
            await ws.send(synth("Wait.", f"p{i}"))
        await ws.send(synth("Again.", "p1"))
        await ws.send(synth("One too many.", "p4"))
        seen = [orjson.loads(await ws.recv()) for _ in range(3)]
        errors = {e["request_id"]: e["code"] for e in seen if e["type"] == "error"}
        assert errors == {"p1": "duplicate_request_id", "p4": "too_many_pending"}
        fake_engine.gate.set()
        fake_engine.hold = False
        reply = await read_until_terminal(ws, "p3")
        assert reply.last["type"] == "synthesis_complete"


async def test_vanished_client_cancels_its_queued_work(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    fake_engine.hold = True
    vanishing = await connect(fake_server.ws_url + BIDI)
    for rid in ("v1", "v2", "v3"):
        await vanishing.send(synth(f"Vanishing {rid}.", rid))
    assert orjson.loads(await vanishing.recv())["type"] == "synthesis_start"
    await asyncio.to_thread(fake_engine.entered.wait, 10)
    vanishing.transport.abort()
    async with connect(fake_server.ws_url + BIDI) as ws:
        # the in-flight call is aborted, which frees the worker for this session
        await ws.send('{"text": "Other client.", "request_id": "o"}')
        assert orjson.loads(await ws.recv())["type"] == "synthesis_start"
        fake_engine.hold = False
        fake_engine.gate.set()
        reply = await read_until_terminal(ws, "o")
        assert reply.last["type"] == "synthesis_complete"
    assert fake_engine.cancelled == ["Vanishing v1."]
    assert not any(c.startswith(("Vanishing v2", "Vanishing v3")) for c in fake_engine.calls)


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"not json", 400, "invalid_json"),
        (b"[]", 400, "not_an_object"),
        (b"{}", 400, "missing_text"),
        (b'{"text": "Hi.", "voice": "zz"}', 400, "unknown_voice"),
        (b'{"text": "Hi.", "speed": 0}', 400, "invalid_speed"),
        (b'{"text": "Hi.", "format": "mp3"}', 400, "unsupported_format"),
        (b'{"text": "Hi.", "stream": "yes"}', 400, "invalid_field"),
    ],
)
async def test_post_bad_input(
    fake_server: RunningServer, body: bytes, status: int, code: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        r = await http.post("/invocations", content=body)
    assert r.status_code == status
    assert r.json()["error"]["code"] == code
    assert r.json()["error"]["message"]


async def test_unknown_route_and_method(fake_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        missing = await http.get("/nope")
        wrong = await http.get("/invocations")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


async def test_post_pcm_stream_and_file_agree(fake_server: RunningServer) -> None:
    text = "First part. Second part."
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        whole = await http.post("/invocations", json={"text": text})
        async with http.stream("POST", "/invocations", json={"text": text, "stream": True}) as r:
            streamed = b"".join([c async for c in r.aiter_raw()])
    assert whole.content == streamed
    assert len(streamed) == expected_pcm_bytes("First part.") + expected_pcm_bytes("Second part.")
    assert float(whole.headers["x-audio-duration-s"]) == pytest.approx(len(streamed) / 48_000)


async def test_voices_lists_what_is_loaded(fake_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        body = (await http.get("/voices")).json()
    # no --default-voice: the English pack is preferred over the registry's jf_alpha
    assert body["default"] == "af_test"
    assert [v["name"] for v in body["voices"]] == ["af_test", "jf_alpha"]


async def test_not_ready_until_the_model_has_loaded() -> None:
    release = threading.Event()
    engine = FakeEngine()

    def slow_factory(_: Settings) -> FakeEngine:
        release.wait(timeout=30)
        return engine

    app = create_app(Settings(warmup=False), engine_factory=slow_factory, g2p_factory=identity_g2p)
    with serve(app) as server:
        async with (
            httpx.AsyncClient(base_url=server.http_url) as http,
            connect(server.ws_url + BIDI) as ws,
        ):
            ping = await http.get("/ping")
            assert (ping.status_code, ping.json()["status"]) == (503, "loading")
            post = await http.post("/invocations", json={"text": "Hi."})
            assert (post.status_code, post.json()["error"]["code"]) == (503, "not_ready")
            await ws.send(synth("Hi.", "early"))
            assert orjson.loads(await ws.recv())["code"] == "not_ready"
            release.set()
            await asyncio.to_thread(app.state.service.settled.wait, 10)
            assert (await http.get("/ping")).status_code == 200
            await ws.send(synth("Hi.", "later"))  # the same session, now served
            assert (await read_until_terminal(ws, "later")).last["type"] == "synthesis_complete"


async def test_a_failed_load_reports_why() -> None:
    def broken(_: Settings) -> FakeEngine:
        raise RuntimeError("weights missing")

    app = create_app(Settings(warmup=False), engine_factory=broken, g2p_factory=identity_g2p)
    with serve(app) as server:
        await asyncio.to_thread(app.state.service.settled.wait, 10)
        async with httpx.AsyncClient(base_url=server.http_url) as http:
            ping = await http.get("/ping")
    assert ping.status_code == 503
    assert ping.json() == {
        "status": "failed",
        "detail": "model failed to load: weights missing",
        "inflight": 0,
    }


# --- text the model server cannot read, through the real normalisation ------------------------

BREAKS_G2P = "G2P-BUG"  # text with this in it makes ReadingG2P fail, as a bug in G2P would


class ReadingG2P:
    """The real text normalisation in front of the identity G2P: what reaches the fake engine
    is the text as it would be read (numbers as words)."""

    name = "normalize+identity"

    def __call__(self, text: str) -> str:
        if BREAKS_G2P in text:
            raise RuntimeError("g2p bug")
        return normalize(text)


@pytest.fixture(scope="module")
def reading_server() -> Iterator[RunningServer]:
    settings = Settings(workers=2, max_text_chars=5_000, warmup=False)
    app = create_app(settings, engine_factory=lambda _: FakeEngine(), g2p_factory=ReadingG2P)
    with serve(app) as running:
        assert app.state.service.settled.wait(timeout=10)
        yield running


async def test_a_400_digit_number_is_read_on_every_path(reading_server: RunningServer) -> None:
    digits = "1234567890" * 40  # num2words raised OverflowError: a 500, a cut stream, an error
    spoken = " ".join(
        ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "zero"] * 40
    )
    async with httpx.AsyncClient(base_url=reading_server.http_url, timeout=30) as http:
        as_words = await http.post("/invocations", json={"text": spoken})
        whole = await http.post("/invocations", json={"text": digits})
        async with http.stream("POST", "/invocations", json={"text": digits, "stream": True}) as r:
            assert r.status_code == 200
            streamed = b"".join([c async for c in r.aiter_raw()])
    async with connect(reading_server.ws_url + BIDI) as ws:
        await ws.send(synth(digits, "digits"))
        reply = await read_until_terminal(ws, "digits")
    assert whole.status_code == 200
    assert reply.types == ["synthesis_start", "synthesis_complete"]
    # the digits are read one by one, the same audio on all three paths
    assert whole.content == as_words.content == streamed == reply.pcm
    segments = split_phonemes(spoken)
    assert len(segments) == 4
    assert len(whole.content) == sum(expected_pcm_bytes(s) for s in segments)


async def test_text_g2p_fails_on_is_refused_cleanly(reading_server: RunningServer) -> None:
    text = f"Read {BREAKS_G2P} aloud."
    async with httpx.AsyncClient(base_url=reading_server.http_url, timeout=30) as http:
        whole = await http.post("/invocations", json={"text": text})
        async with http.stream("POST", "/invocations", json={"text": text, "stream": True}) as r:
            await r.aread()
            streamed = r
    for response in (whole, streamed):  # refused before any audio, the stream included
        assert response.status_code == 422
        error = response.json()["error"]
        assert (error["code"], error["retryable"]) == ("unreadable_text", False)
        assert "g2p bug" not in response.text
        assert "Traceback" not in response.text
    async with connect(reading_server.ws_url + BIDI) as ws:
        await ws.send(synth(text, "bad"))
        reply = await read_until_terminal(ws, "bad")
        assert reply.types == ["synthesis_start", "error"]
        assert (reply.last["code"], reply.last["request_id"]) == ("unreadable_text", "bad")
        assert reply.pcm == b""
        await ws.send(synth("Still works.", "after"))  # the session stays usable
        after = await read_until_terminal(ws, "after")
    assert after.types == ["synthesis_start", "synthesis_complete"]
    assert len(after.pcm) == expected_pcm_bytes("Still works.")
