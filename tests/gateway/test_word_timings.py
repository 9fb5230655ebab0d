"""Word timings through the gateway, on real servers (the fake engine gives every character
10 ms, so times follow from the text): `words` events before the audio they describe, across a
reply's chunks; barge-in with `played_ms` on the WebSocket and over SSE answered with exactly
what was heard; the conversation keeps only that."""

from __future__ import annotations

import asyncio
import base64
import itertools
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect

from gateway.app import create_app as create_gateway
from gateway.sources.sse import SSEDecoder
from gateway.speak_ws.session import INTERRUPTED
from tests.support.gateway_client import sse_get
from tests.support.openai_stub import create_stub, llm_gateway_settings
from tests.support.servers import RunningServer, serve

TEXT = "Hello there, my friend. Your order shipped today. It arrives on Tuesday."
PACED = {"text": TEXT, "format": "pcm", "timestamps": "true", "echo_tps": "8"}


def prefix_through(text: str, words: list[dict[str, Any]], last: int) -> str:
    """The text up to the end of word `last`, found in order as the timings spell them."""
    end = 0
    for word in words[: last + 1]:
        end = text.index(word["word"], end) + len(word["word"])
    return text[:end]


async def test_words_come_before_the_audio_they_describe(gateway_on_fake: RunningServer) -> None:
    params = {"text": TEXT, "format": "pcm", "timestamps": "true", "echo_tps": "20"}
    reply = await sse_get(gateway_on_fake.http_url, params)
    audio_ms = 0.0
    words: list[dict[str, Any]] = []
    for event in reply.events:
        body = orjson.loads(event.data)
        if event.event == "audio_chunk":
            audio_ms += len(base64.b64decode(body["data"])) / 48  # PCM: 48 bytes per ms
        elif event.event == "words":
            # nothing of what these words describe has been sent yet
            assert body["words"][0]["start_ms"] >= audio_ms - 1, (body, audio_ms)
            words += body["words"]
    end = reply.one("agent_end")["metrics"]
    assert end["chunks"] >= 2  # the timings run on across chunks
    assert prefix_through(TEXT, words, len(words) - 1).rstrip(".") == TEXT.rstrip(".")
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts)
    assert all(w["start_ms"] < w["end_ms"] for w in words)
    assert all(a["end_ms"] <= b["start_ms"] for a, b in itertools.pairwise(words))
    assert words[-1]["end_ms"] <= end["duration_s"] * 1000 + 1
    first_chunk_ms = end["chunk_audio_s"][0] * 1000
    assert words[-1]["start_ms"] > first_chunk_ms  # later chunks are placed after the first


async def test_no_words_unless_asked(gateway_on_fake: RunningServer) -> None:
    reply = await sse_get(gateway_on_fake.http_url, {"text": "Hello there.", "format": "pcm"})
    assert "words" not in reply.names


async def words_until(ws: ClientConnection, count: int) -> tuple[str, list[dict[str, Any]]]:
    """Frames until `count` words are timed; the utterance id and the words."""
    words: list[dict[str, Any]] = []
    uid = ""
    while len(words) < count:
        frame = await ws.recv()
        if isinstance(frame, bytes):
            continue
        event = orjson.loads(frame)
        uid = event.get("utterance_id", uid)
        if event["type"] == "words":
            words += event["words"]
        assert event["type"] not in ("agent_end", "error"), event
    return uid, words


async def test_websocket_barge_in_answers_what_was_heard(gateway_on_fake: RunningServer) -> None:
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        await ws.send(orjson.dumps({"type": "speak", **PACED}).decode())
        uid, words = await words_until(ws, 3)
        played = words[2]["end_ms"]  # the third word has just finished
        await ws.send(orjson.dumps({"type": "cancel", "played_ms": played}).decode())
        while (event := orjson.loads(await _text(ws)))["type"] != "cancelled":
            pass
        assert event == {
            "type": "cancelled",
            "utterance_id": uid,
            "played_ms": played,
            "heard_text": prefix_through(TEXT, words, 2),
        }
        # one millisecond earlier, the third word was cut: not heard
        await ws.send(orjson.dumps({"type": "speak", **PACED}).decode())
        _, words = await words_until(ws, 3)
        await ws.send(
            orjson.dumps({"type": "cancel", "played_ms": words[2]["end_ms"] - 1}).decode()
        )
        while (event := orjson.loads(await _text(ws)))["type"] != "cancelled":
            pass
        assert event["heard_text"] == prefix_through(TEXT, words, 1)


async def _text(ws: ClientConnection) -> str:
    while isinstance(frame := await ws.recv(), bytes):
        pass
    assert isinstance(frame, str)
    return frame


async def test_sse_barge_in_through_its_cancel_route(gateway_on_fake: RunningServer) -> None:
    async with (
        httpx.AsyncClient(base_url=gateway_on_fake.http_url, timeout=30) as http,
        http.stream("GET", "/v1/speak/sse", params=PACED) as r,
    ):
        uid = r.headers["x-utterance-id"]
        decoder = SSEDecoder()
        words: list[dict[str, Any]] = []
        events: list[str] = []
        cancel: asyncio.Task[httpx.Response] | None = None
        async for raw in r.aiter_raw():
            for event in decoder.push(raw):
                events.append(event.event)
                if event.event == "words":
                    words += orjson.loads(event.data)["words"]
                if len(words) >= 2 and cancel is None:
                    played = words[1]["end_ms"]
                    cancel = asyncio.create_task(
                        http.post(f"/v1/speak/{uid}/cancel", json={"played_ms": played})
                    )
                if event.event == "cancelled":
                    last = orjson.loads(event.data)
        assert cancel is not None
        answer = await cancel
    heard = prefix_through(TEXT, words, 1)
    assert answer.json() == {"utterance_id": uid, "played_ms": played, "heard_text": heard}
    assert events[-1] == "cancelled"  # the stream ends with it
    assert last == {"utterance_id": uid, "played_ms": played, "heard_text": heard}
    assert "agent_end" not in events
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        gone = await http.post(f"/v1/speak/{uid}/cancel", json={"played_ms": 0})
    assert (gone.status_code, gone.json()["error"]["code"]) == (404, "unknown_utterance")


async def test_history_keeps_only_what_was_heard(fake_server: RunningServer) -> None:
    answer = ["Sure", ", here", " is", " the", " answer", " you", " asked", " for.", " More"]
    with serve(create_stub(answer, stall_after=8)) as llm:  # then it keeps writing, slowly
        settings = llm_gateway_settings(fake_server.http_url, llm.http_url)
        with serve(create_gateway(settings)) as gw:
            async with connect(gw.ws_url + "/v1/speak/ws") as ws:
                speak = {
                    "type": "speak",
                    "prompt": "Where is my order?",
                    "format": "pcm",
                    "timestamps": True,  # for this test to pick played_ms (prompts are timed)
                }
                await ws.send(orjson.dumps(speak).decode())
                _, words = await words_until(ws, 3)
                played = words[2]["end_ms"]
                await ws.send(orjson.dumps({"type": "cancel", "played_ms": played}).decode())
                while (event := orjson.loads(await _text(ws)))["type"] != "cancelled":
                    pass
                heard = event["heard_text"]
                assert heard == prefix_through("".join(answer), words, 2)
                again = {"type": "speak", "prompt": "And when?", "format": "pcm"}
                await ws.send(orjson.dumps(again).decode())
                while orjson.loads(await _text(ws))["type"] != "text_delta":
                    pass  # the LLM has been asked
                await ws.send(orjson.dumps({"type": "cancel"}).decode())
            first, second = llm.app.state.requests[:2]
    assert second["messages"][1:] == [
        {"role": "user", "content": "Where is my order?"},
        {"role": "assistant", "content": f"{heard} {INTERRUPTED}"},
        {"role": "user", "content": "And when?"},
    ]
    assert len(first["messages"]) == 2
