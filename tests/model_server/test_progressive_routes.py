"""Progressive synthesis through the real routes and the real synthesizer and scheduler, over
the fake engine in two passes (`FakeProgressiveEngine`: its windows, joined, are the whole
call's audio): more binary frames per request and nothing else changes on the wire; word
timings before the audio they describe; `--progressive off`; a cancel between windows; each
window its own step in the scheduler, with its own deadline; the speed learned per segment."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Hashable, Iterator
from typing import Any, TypeVar

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from kokoro_contract.protocol import SynthesisRequest, parse_words
from model_server.config import Settings
from model_server.engines.base import CancelToken
from model_server.scheduler import Scheduler
from model_server.synthesis import Synthesizer
from model_server.windows import Schedule
from tests.support.fakes import (
    FakeEngine,
    FakeProgressiveEngine,
    IdentityG2P,
    serve_fake,
)
from tests.support.model_server_client import read_until_terminal, synth
from tests.support.servers import RunningServer

T = TypeVar("T")
BIDI = "/invocations-bidirectional-stream"
RATE = 24_000
# 150 characters: 150 frames of the fake engine, several windows of the default schedule
LONG = (
    "When the evening light fell across the valley the travellers stopped to rest and "
    "counted the miles they had walked and the ones still ahead of them before dawn."
)


@pytest.fixture(scope="module")
def progressive_engine() -> FakeProgressiveEngine:
    return FakeProgressiveEngine()


@pytest.fixture
def engine(progressive_engine: FakeProgressiveEngine) -> FakeProgressiveEngine:
    progressive_engine.reset()
    return progressive_engine


def _server(engine: FakeEngine, **settings: Any) -> Iterator[RunningServer]:
    with serve_fake(engine, **settings) as running:
        yield running


@pytest.fixture(scope="module")
def progressive_server(progressive_engine: FakeProgressiveEngine) -> Iterator[RunningServer]:
    yield from _server(progressive_engine, progressive=True)


@pytest.fixture(scope="module")
def whole_server(progressive_engine: FakeProgressiveEngine) -> Iterator[RunningServer]:
    yield from _server(progressive_engine, progressive=False)


async def _ws_frames(server: RunningServer, text: str, rid: str, **extra: Any) -> list[Any]:
    """Every frame of one request: JSON events as dicts, audio as bytes."""
    frames: list[Any] = []
    async with connect(server.ws_url + BIDI) as ws:
        await ws.send(synth(text, rid, **extra))
        async for frame in ws:
            frames.append(frame if isinstance(frame, bytes) else orjson.loads(frame))
            if isinstance(frame, str) and frames[-1]["type"] in {"synthesis_complete", "error"}:
                return frames
    raise AssertionError(f"closed early: {frames}")


def _audio(frames: list[Any]) -> bytes:
    return b"".join(f for f in frames if isinstance(f, bytes))


async def test_each_window_leaves_as_its_own_binary_frame_and_the_audio_is_the_whole_calls(
    engine: FakeProgressiveEngine,
    progressive_server: RunningServer,
    whole_server: RunningServer,
) -> None:
    progressive = await _ws_frames(progressive_server, LONG, "p")
    windows = list(engine.windows)
    engine.reset()
    whole = await _ws_frames(whole_server, LONG, "w")
    assert engine.windows == []  # off: one engine call per segment, no windows
    assert engine.calls == [LONG]
    assert len(windows) >= 2
    assert windows[0] == (0, 24 + 3)  # the first window: 24 frames and its right context
    audio_frames = [f for f in progressive if isinstance(f, bytes)]
    assert len(audio_frames) == len(windows)  # one binary frame per window
    assert len([f for f in whole if isinstance(f, bytes)]) == 1
    assert _audio(progressive) == _audio(whole)  # the same bytes: the seams cannot be heard
    # the wire is otherwise the same: start, audio, complete with the byte count
    assert progressive[0] == {"type": "synthesis_start", "request_id": "p"}
    assert progressive[-1]["type"] == "synthesis_complete"
    assert progressive[-1]["audio_bytes"] == len(_audio(progressive))


async def test_word_timings_come_before_the_audio_they_end_in_and_are_the_whole_calls(
    engine: FakeProgressiveEngine,
    progressive_server: RunningServer,
    whole_server: RunningServer,
) -> None:
    progressive = await _ws_frames(progressive_server, LONG, "p", timestamps=True)
    whole = await _ws_frames(whole_server, LONG, "w", timestamps=True)

    def words(frames: list[Any]) -> list[tuple[str, float, float]]:
        return [
            (w.word, w.start, w.end)
            for f in frames
            if isinstance(f, dict) and f["type"] == "word_timings"
            for w in parse_words(f["words"])
        ]

    assert words(progressive) == words(whole)
    assert len(words(progressive)) == len(LONG.split())
    timing_frames = [f for f in progressive if isinstance(f, dict) and f["type"] == "word_timings"]
    assert len(timing_frames) >= 2  # words as their windows come, not all at once
    # every word ends in audio that comes after the frame that names it, or at the end
    sent = 0
    for frame in progressive:
        if isinstance(frame, bytes):
            sent += len(frame) // 2
        elif frame["type"] == "word_timings":
            for word in parse_words(frame["words"]):
                assert word.end * RATE >= sent - 1, (word, sent)


async def test_a_streamed_post_body_comes_window_by_window(
    engine: FakeProgressiveEngine, progressive_server: RunningServer
) -> None:
    pieces: list[bytes] = []
    async with (
        httpx.AsyncClient(base_url=progressive_server.http_url) as http,
        http.stream("POST", "/invocations", json={"text": LONG, "stream": True}) as response,
    ):
        async for piece in response.aiter_raw():
            pieces.append(piece)
    body = b"".join(pieces)
    assert len(engine.windows) >= 2
    async with httpx.AsyncClient(base_url=progressive_server.http_url) as http:
        one = await http.post("/invocations", json={"text": LONG, "timestamps": True})
    assert base64.b64decode(one.json()["audio"]) == body


async def test_a_cancel_while_a_window_runs_stops_there(
    engine: FakeProgressiveEngine, progressive_server: RunningServer
) -> None:
    engine.hold_from = 1  # the first window goes out; the second holds
    async with connect(progressive_server.ws_url + BIDI) as ws:
        await ws.send(synth(LONG, "held"))
        assert orjson.loads(await ws.recv())["type"] == "synthesis_start"
        first = await ws.recv()
        assert isinstance(first, bytes)
        assert len(first) > 0
        await asyncio.to_thread(engine.entered.wait, 10)
        await ws.send('{"type": "cancel", "request_id": "held"}')
        reply = await read_until_terminal(ws, "held")
        assert reply.last == {"type": "synthesis_cancelled", "request_id": "held"}
        assert reply.frames == 0  # nothing after the cancel
    assert engine.window_cancelled == [engine.windows[1]]
    assert len(engine.windows) == 2  # and no window after it


# --- the synthesizer and the scheduler ----------------------------------------------------------


class RecordingScheduler(Scheduler):
    """The real scheduler, noting each step's deadline."""

    def __init__(self) -> None:
        super().__init__(1)
        self.steps: list[tuple[str, float | None]] = []

    async def run(
        self,
        key: Hashable,
        fn: Callable[[CancelToken], T],
        *,
        phonemes: int = 0,
        deadline: float | None = None,
        explicit: bool = False,
        **step: Any,
    ) -> T:
        kind = "window" if step.get("frames") else "front" if "tally" in step else "whole"
        self.steps.append((kind, deadline))
        return await super().run(
            key, fn, phonemes=phonemes, deadline=deadline, explicit=explicit, **step
        )


def _synthesizer(engine: FakeEngine, scheduler: Scheduler) -> Synthesizer:
    return Synthesizer(engine, IdentityG2P(), scheduler, schedule=Schedule(first=24, context=12))


async def test_a_cancel_between_windows_stops_at_the_next_window() -> None:
    engine = FakeProgressiveEngine()
    synthesizer = _synthesizer(engine, Scheduler(1))
    try:
        request = SynthesisRequest(LONG, "jf_alpha", 1.0, "r")
        stream = synthesizer.stream_timed(request, key="k")
        first = await anext(stream)  # the first window's audio
        assert first.pcm
        await stream.aclose()  # the reply is cancelled before the next window starts
        assert engine.windows == [(0, 36)]
        assert engine.window_cancelled == []
    finally:
        synthesizer.close()


async def test_every_window_is_a_step_with_the_deadline_of_the_audio_before_it() -> None:
    engine = FakeProgressiveEngine()
    scheduler = RecordingScheduler()
    synthesizer = _synthesizer(engine, scheduler)
    try:
        request = SynthesisRequest(f"{LONG} Short one.", "jf_alpha", 1.0, "r")
        received = 1_000.0
        chunks = [c async for c in synthesizer.stream_timed(request, "k", received)]
    finally:
        synthesizer.close()
    kinds = [kind for kind, _ in scheduler.steps]
    assert kinds[0] == "front"
    assert kinds.count("front") == 2  # one per segment (sentence)
    assert kinds.count("window") == len(engine.windows) >= 3
    # a step's deadline is the request's arrival plus the audio sent before it: a new reply's
    # first window (deadline: its arrival) goes ahead of another reply's later windows
    sent = 0.0
    deadlines = [d for _, d in scheduler.steps]
    assert deadlines[0] == deadlines[1] == received
    chunk_audio = [len(c.pcm) / 2 / RATE for c in chunks]
    for deadline, step in zip(deadlines[1:], scheduler.steps[1:], strict=True):
        if step[0] == "window":
            assert deadline == pytest.approx(received + sent)
            sent += chunk_audio.pop(0)
        else:  # the second segment's front: after all of the first's audio
            assert deadline == pytest.approx(received + sent)
    # the speed learned per segment (what GET /load reports), the decoder's per window, and
    # each segment's compute before its first audio (its front pass and first window)
    assert scheduler.speed.calls + scheduler.shared_speed.calls == 2
    assert scheduler.window_speed.calls == len(engine.windows)
    assert scheduler.first_window.calls == 2


async def test_the_load_report_says_what_a_new_reply_s_start_costs(
    progressive_server: RunningServer, whole_server: RunningServer
) -> None:
    async with httpx.AsyncClient() as http:
        on = (await http.get(progressive_server.http_url + "/load")).json()
        off = (await http.get(whole_server.http_url + "/load")).json()
    # progressive: the learned front pass and first window of a typical first chunk (how it
    # compares with the whole chunk depends on what this fake engine was asked before);
    # off: none, the gateway counts the whole chunk
    assert isinstance(on["first_window_s"], float)
    assert on["first_window_s"] >= 0  # the fake engine takes microseconds: 0.0 at 3 digits
    assert off["first_window_s"] is None


async def test_a_gateway_plans_for_windows_from_its_first_reply_when_told(
    progressive_server: RunningServer, whole_server: RunningServer
) -> None:
    """From that load report (`Admitted.progressive`), a gateway's first reply already plans
    for windows (`EarlyAudio.assume`); one in front of `--progressive off` learns nothing. A
    reply of one window shows nothing either way, so what the plan holds is what it was told."""
    from gateway.app import create_app as create_gateway
    from gateway.config import Settings as GatewaySettings
    from gateway.reply.plan.rates import FIRST_WINDOW_AUDIO_S
    from tests.support.servers import serve

    told = []
    for server in (progressive_server, whole_server):
        app = create_gateway(GatewaySettings(model_server_url=server.http_url))
        with serve(app) as gateway:
            async with httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http:
                body = {"text": "Hi there.", "format": "pcm", "mode": "bidi"}
                reply = await http.post("/v1/speak", json=body)
        assert b"event: audio_chunk" in reply.content
        assert b"event: agent_end" in reply.content
        told.append(app.state.service.replies.early.seconds)
    assert told == [FIRST_WINDOW_AUDIO_S, None]


def test_progressive_is_a_setting_on_by_default() -> None:
    from model_server.config import parse_settings

    assert Settings().progressive is True
    assert parse_settings([]).progressive is True
    assert parse_settings(["--progressive", "off"]).progressive is False
    assert parse_settings([], env={"MODEL_SERVER_PROGRESSIVE": "off"}).progressive is False
    assert parse_settings(["--progressive", "on"]).progressive is True


def test_an_engine_without_two_passes_is_voiced_whole() -> None:
    synthesizer = Synthesizer(FakeEngine(), IdentityG2P(), Scheduler(1))
    try:
        assert synthesizer.progressive is None
    finally:
        synthesizer.close()
