"""The speak WebSocket's protocol 2 through the real gateway and a real model server (the
controllable engine): several contexts on one socket, acknowledged flushes, the client's own
buffering, a cancel of one context, the cap and the idle expiry."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import orjson
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from tests.support.fakes import expected_pcm_bytes
from tests.support.gateway_client import split_audio_frame
from tests.support.servers import RunningServer, serve

V2 = "/v1/speak/ws?protocol=2"


@pytest.fixture(scope="module")
def small_gateway(fake_server: RunningServer) -> Iterator[RunningServer]:
    """A gateway of its own: two contexts a socket, idle after half a second."""
    from gateway.app import create_app
    from gateway.config import Settings

    settings = Settings(
        model_server_url=fake_server.http_url, max_contexts_per_socket=2, context_idle_s=0.5
    )
    with serve(create_app(settings)) as running:
        yield running


class Frames:
    """A protocol 2 client's view: every frame received so far, audio by context."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict[str, Any]] = []
        self.audio: dict[str, bytes] = {}

    async def send(self, **body: Any) -> None:
        await self.ws.send(orjson.dumps(body).decode())

    async def until(self, kind: str, context_id: str | None = None) -> dict[str, Any]:
        """Read frames until one of type `kind` (for `context_id`, if given) has come."""
        async for event in self._frames():
            if event["type"] == kind and context_id in (None, event.get("context_id")):
                return event
        code, reason = self.ws.close_code, self.ws.close_reason
        raise AssertionError(f"the connection closed ({code} {reason!r}) after {self.events}")

    async def _frames(self) -> AsyncIterator[dict[str, Any]]:
        async for frame in self.ws:
            if isinstance(frame, bytes):
                cid, data = split_audio_frame(frame)
                self.audio[cid] = self.audio.get(cid, b"") + data
                continue
            event = orjson.loads(frame)
            # what the client had of each context's audio when the event came
            event["_audio"] = {k: len(v) for k, v in self.audio.items()}
            self.events.append(event)
            yield event

    def of(self, context_id: str) -> list[str]:
        return [e["type"] for e in self.events if e.get("context_id") == context_id]


async def test_two_contexts_on_one_socket_each_with_its_own_voice_flushes_and_end(
    gateway_on_fake: RunningServer,
) -> None:
    async with connect(gateway_on_fake.ws_url + V2) as ws:
        c = Frames(ws)
        await c.send(type="speak", context_id="a", format="pcm", voice="jf_alpha")
        b = {"format": "pcm", "voice": "af_test", "buffering": "client"}
        await c.send(type="speak", context_id="b", **b)
        await c.send(type="text", context_id="b", delta="Second context here.")
        await c.send(type="text", context_id="a", delta="First context here. ")
        await c.send(type="flush", context_id="b", flush_id=7)
        flushed_b = await c.until("flushed", "b")
        # b's audio up to its flush had all come when `flushed` did
        assert flushed_b["flush_id"] == 7
        assert flushed_b["_audio"]["b"] == expected_pcm_bytes("Second context here.")
        await c.send(type="flush", context_id="a", flush_id="a-1")
        flushed_a = await c.until("flushed", "a")
        assert flushed_a["flush_id"] == "a-1"
        assert flushed_a["_audio"]["a"] == expected_pcm_bytes("First context here.")
        # a flush keeps the context open: more text, then its close ends it
        await c.send(type="text", context_id="a", delta="And more.")
        await c.send(type="close_context", context_id="a")
        end_a = await c.until("agent_end", "a")
        assert end_a["metrics"]["text_chars"] == len("First context here. And more.")
        assert len(c.audio["a"]) == expected_pcm_bytes("First context here.") + expected_pcm_bytes(
            "And more."
        )
        await c.send(type="close_context", context_id="b")
        await c.until("agent_end", "b")
        starts = {e["context_id"]: e for e in c.events if e["type"] == "audio_stream_start"}
        assert (starts["a"]["voice"], starts["b"]["voice"]) == ("jf_alpha", "af_test")
        assert c.of("b") == [
            "agent_start",
            "audio_stream_start",
            "text_delta",
            "flushed",
            "audio_stream_end",
            "agent_end",
        ]
        # every event names its context, none protocol 1's utterance
        assert all("utterance_id" not in e for e in c.events)


async def test_a_cancel_stops_one_context_and_leaves_the_other_playing(
    gateway_on_fake: RunningServer,
) -> None:
    async with connect(gateway_on_fake.ws_url + V2) as ws:
        c = Frames(ws)
        await c.send(type="speak", context_id="old", format="pcm")
        await c.send(type="text", context_id="old", delta="An answer that was interrupted.")
        await c.send(type="flush", context_id="old", flush_id=1)
        await c.until("flushed", "old")
        # barge-in: the next turn opens at once, without waiting for the old one's end
        await c.send(type="speak", context_id="new", format="pcm", text="The next answer.")
        await c.send(type="cancel", context_id="old", played_ms=100)
        cancelled = await c.until("cancelled", "old")
        assert cancelled["played_ms"] == 100
        await c.until("agent_end", "new")
        assert len(c.audio["new"]) == expected_pcm_bytes("The next answer.")
        assert "agent_end" not in c.of("old")
        # the old id is free again; the socket goes on
        await c.send(type="cancel", context_id="old")
        error = await c.until("error", "old")
        assert error["code"] == "unknown_context"


async def test_the_cap_refuses_a_third_context_and_an_idle_one_is_closed(
    small_gateway: RunningServer,
) -> None:
    async with connect(small_gateway.ws_url + V2) as ws:
        c = Frames(ws)
        await c.send(type="speak", context_id="a", format="pcm")
        await c.send(type="speak", context_id="b", format="pcm")
        await c.send(type="speak", context_id="c", format="pcm", text="No room.")
        refused = await c.until("error", "c")
        assert (refused["code"], refused["status"], refused["retryable"]) == (
            "too_many_contexts",
            429,
            True,
        )
        # b speaks and is closed; a waits for text and says nothing: idle, closed by the server
        await c.send(type="text", context_id="b", delta="Hello.")
        await c.send(type="close_context", context_id="b")
        await c.until("agent_end", "b")
        closed = await c.until("context_closed", "a")
        assert closed["reason"] == "idle"
        assert c.of("a") == ["agent_start", "audio_stream_start", "context_closed"]
        # both gone: room again, and the socket still serves
        await c.send(type="speak", context_id="c", format="pcm", text="Room now.")
        await c.until("agent_end", "c")
        assert len(c.audio["c"]) == expected_pcm_bytes("Room now.")


async def test_an_unknown_protocol_is_refused_before_the_upgrade(
    gateway_on_fake: RunningServer,
) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(gateway_on_fake.ws_url + "/v1/speak/ws?protocol=3"):
            pass
    assert refused.value.response.status_code == 400
    body = orjson.loads(refused.value.response.body or b"{}")
    assert body["error"]["code"] == "invalid_protocol"


async def test_protocol_1_answers_text_after_a_refused_speak_as_it_always_did(
    gateway_on_fake: RunningServer,
) -> None:
    """Each utterance now runs in a task of its own: protocol 1 still reads the next message
    only once the session knows the `speak` was refused, so its text is `no_open_utterance`
    (released clients count on it), never dropped in silence."""
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        await ws.send(orjson.dumps({"type": "speak", "voice": "nobody"}).decode())
        await ws.send(orjson.dumps({"type": "text", "delta": "Hello."}).decode())
        first, second = [orjson.loads(await ws.recv()) for _ in range(2)]
    assert (first["code"], second["code"]) == ("unknown_voice", "no_open_utterance")
