"""The pipecat plugin (`integrations/pipecat`, `pipecat_kokoro_voice`) in pipecat's own test
harness (`pipecat.tests.utils.run_test`, real frames) against a real gateway on loopback, over
the fake engine (every character 10 ms, so audio lengths and word times follow from the text)
and once over the real model; and pipecat's own `OpenAITTSService` against the gateway's
`/v1/audio/speech`."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from pipecat.clocks.system_clock import SystemClock
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    TTSUpdateSettingsFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.tts_service import TextAggregationMode
from pipecat.tests.utils import QueuedFrameProcessor, run_test
from pipecat.workers.runner import WorkerRunner
from pipecat_kokoro_voice import KokoroVoiceError, KokoroVoiceTTSService, speak_ws_url
from pipecat_kokoro_voice.wire import ContextTable, Ended, Voice, utterance_id_for

from bench.frameworks.pipecat import run_with
from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from tests.support.fakes import FakeEngine, expected_pcm_bytes
from tests.support.gateway_client import counted, metric, wait_for_metric
from tests.support.servers import RunningServer, serve

Settings = KokoroVoiceTTSService.Settings


def service(gateway: RunningServer, voice: str | None = None) -> KokoroVoiceTTSService:
    return KokoroVoiceTTSService(url=gateway.http_url, settings=Settings(voice=voice))


def audio_of(frames: Sequence[Frame]) -> bytes:
    return b"".join(f.audio for f in frames if isinstance(f, TTSAudioRawFrame))


def words_of(frames: Sequence[Frame]) -> list[TTSTextFrame]:
    return [f for f in frames if isinstance(f, TTSTextFrame)]


def loud(pcm: bytes) -> bool:
    """Not silence: some sample far from zero."""
    samples = memoryview(pcm).cast("h")
    return max(abs(s) for s in samples) > 1000


@pytest.mark.parametrize(
    ("pipeline_rate", "asked", "spoken_at"),
    [(16_000, None, 16_000), (11_025, None, 24_000), (24_000, 8_000, 8_000)],
)
async def test_the_gateway_speaks_at_the_pipelines_rate(
    gateway_on_fake: RunningServer, pipeline_rate: int, asked: int | None, spoken_at: int
) -> None:
    """The pipeline's output rate (or the service's `sample_rate`) is asked of the gateway, so
    nothing resamples here: the frames say it and hold the reply's length at it; a rate the
    gateway does not offer is asked as its 24 kHz, for pipecat's output to resample."""
    text = "Hello there, my friend."
    tts = KokoroVoiceTTSService(url=gateway_on_fake.http_url, sample_rate=asked)
    down, _ = await run_test(
        tts,
        frames_to_send=[TTSSpeakFrame(text)],
        pipeline_params=PipelineParams(audio_out_sample_rate=pipeline_rate),
    )
    assert {f.sample_rate for f in down if isinstance(f, TTSAudioRawFrame)} == {spoken_at}
    samples = len(audio_of(down)) // 2
    assert abs(samples - expected_pcm_bytes(text) // 2 * spoken_at / 24_000) <= 2
    assert loud(audio_of(down))


async def test_a_spoken_frame_comes_back_as_its_pcm_and_timed_words(
    gateway_on_fake: RunningServer,
) -> None:
    text = "Hello there, my friend."
    down, _ = await run_test(
        service(gateway_on_fake, voice="jf_alpha"), frames_to_send=[TTSSpeakFrame(text)]
    )
    kinds = [type(f) for f in down if isinstance(f, TTSStartedFrame | TTSStoppedFrame)]
    assert kinds == [TTSStartedFrame, TTSStoppedFrame]
    pcm = audio_of(down)
    assert all(
        f.sample_rate == 24_000 and f.num_channels == 1
        for f in down
        if isinstance(f, TTSAudioRawFrame)
    )
    assert all(len(f.audio) % 2 == 0 for f in down if isinstance(f, TTSAudioRawFrame))
    assert len(pcm) == expected_pcm_bytes(text)  # one chunk: the whole text, not a byte less
    assert loud(pcm)
    words = words_of(down)
    assert [w.text for w in words] == text.split()
    # on the utterance's clock: the fake engine gives every character 10 ms
    starts = [text.index(w) * 10 for w in text.split()]
    pts = [w.pts or 0 for w in words]
    assert [(p - pts[0]) // 1_000_000 for p in pts] == starts


async def test_the_speed_setting_reaches_the_engine(gateway_on_fake: RunningServer) -> None:
    tts = KokoroVoiceTTSService(url=gateway_on_fake.http_url, settings=Settings(speed=2.0))
    down, _ = await run_test(tts, frames_to_send=[TTSSpeakFrame("Twice as fast.")])
    assert len(audio_of(down)) == expected_pcm_bytes("Twice as fast.", speed=2.0)


class Tape:
    """The frames a pipeline's sink has received so far, and a wait for the next one that
    matters (no sleeps: each step waits for the frame it needs)."""

    def __init__(self, queue: asyncio.Queue[Frame]) -> None:
        self.queue = queue
        self.frames: list[Frame] = []

    async def until(self, wanted: Callable[[Frame], bool]) -> Frame:
        async with asyncio.timeout(30):
            while True:
                frame = await self.queue.get()
                self.frames.append(frame)
                if wanted(frame):
                    return frame


Send = Callable[[Frame], Awaitable[None]]


async def drive(
    processor: FrameProcessor, script: Callable[[Send, Tape, Tape], Awaitable[None]]
) -> tuple[list[Frame], list[Frame]]:
    """`run_test`'s pipeline (source, processor, sink), with a script in place of its list of
    frames: it sends frames and waits for the ones it needs between them. The frames that
    came down and up."""
    down: asyncio.Queue[Frame] = asyncio.Queue()
    up: asyncio.Queue[Frame] = asyncio.Queue()
    source = QueuedFrameProcessor(queue=up, queue_direction=FrameDirection.UPSTREAM)
    sink = QueuedFrameProcessor(queue=down, queue_direction=FrameDirection.DOWNSTREAM)
    worker = PipelineWorker(Pipeline([source, processor, sink]), cancel_on_idle_timeout=False)
    started = asyncio.Event()

    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        started.set()

    worker.add_event_handler("on_pipeline_started", _started)

    down_tape, up_tape = Tape(down), Tape(up)

    async def run_script() -> None:
        await asyncio.wait_for(started.wait(), 10)
        await script(worker.queue_frame, down_tape, up_tape)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await run_with(runner, run_script())  # a failing script cancels the pipeline
    for tape in (down_tape, up_tape):
        while not tape.queue.empty():
            tape.frames.append(tape.queue.get_nowait())
    return down_tape.frames, up_tape.frames


def stopped(context_id: str | None = None) -> Callable[[Frame], bool]:
    return lambda f: isinstance(f, TTSStoppedFrame) and context_id in (None, f.context_id)


async def test_turns_at_once_play_whole_and_in_order_never_refused(
    gateway_on_fake: RunningServer,
) -> None:
    """Three speak frames at once: each is a context of its own on the one socket (the
    gateway plays them side by side, nothing waits on the client); pipecat plays all three,
    in order, each its own audio, and nothing is refused."""
    texts = ["First one here.", "Then the second.", "And a third."]
    refused_before = [
        await counted(gateway_on_fake, "gateway_errors_total", code=code)
        for code in ("busy", "too_many_contexts", "context_in_use", "overloaded")
    ]
    down, up = await run_test(
        service(gateway_on_fake), frames_to_send=[TTSSpeakFrame(t) for t in texts]
    )
    refused_after = [
        await counted(gateway_on_fake, "gateway_errors_total", code=code)
        for code in ("busy", "too_many_contexts", "context_in_use", "overloaded")
    ]
    assert refused_after == refused_before
    assert [f for f in up if isinstance(f, ErrorFrame)] == []
    contexts: list[str] = []
    for frame in down:
        if isinstance(frame, TTSStartedFrame):
            contexts.append(str(frame.context_id))
    assert len(contexts) == 3
    for context_id, spoken in zip(contexts, texts, strict=True):
        pcm = b"".join(
            f.audio for f in down if isinstance(f, TTSAudioRawFrame) and f.context_id == context_id
        )
        assert len(pcm) == expected_pcm_bytes(spoken)
    assert [w.text for w in words_of(down)] == " ".join(texts).split()


@pytest.mark.parametrize("mode", [TextAggregationMode.TOKEN, TextAggregationMode.SENTENCE])
async def test_streamed_llm_tokens_are_one_utterance(
    gateway_on_fake: RunningServer, mode: TextAggregationMode
) -> None:
    """Tokens as they come (the default) or pipecat's sentences: one utterance, every word
    timed as the text spells it (sentences keep the space between them)."""
    from pipecat.frames.frames import (
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )

    text = "Sure, here is the answer you asked for. It has two sentences, and a clause."
    tokens = [text[i : i + 3] for i in range(0, len(text), 3)]  # cut mid-word on purpose
    frames: list[Frame] = [LLMFullResponseStartFrame()]
    frames += [LLMTextFrame(t) for t in tokens]
    frames.append(LLMFullResponseEndFrame())
    tts = KokoroVoiceTTSService(url=gateway_on_fake.http_url, text_aggregation_mode=mode)
    down, up = await run_test(tts, frames_to_send=frames)
    assert [f for f in up if isinstance(f, ErrorFrame)] == []
    assert len([f for f in down if isinstance(f, TTSStartedFrame)]) == 1
    assert [w.text for w in words_of(down)] == text.split()
    pcm = audio_of(down)
    assert len(pcm) % 2 == 0
    assert loud(pcm)
    # the gateway cut it into chunks; each chunk's audio is its characters' plus a pause
    assert len(pcm) >= expected_pcm_bytes(text)


async def test_barge_in_cancels_down_to_the_model_server_and_the_next_one_plays(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    cancels_before = await metric(gateway_on_fake, "gateway_cancels_total")
    fake_engine.hold = True  # the engine's call blocks until cancelled

    async def script(send: Send, down: Tape, up: Tape) -> None:
        await send(TTSSpeakFrame("A long reply that keeps going. " * 4))
        await down.until(lambda f: isinstance(f, TTSStartedFrame))
        assert await asyncio.to_thread(fake_engine.entered.wait, 10)  # synthesis runs now
        await send(InterruptionFrame())
        assert await asyncio.to_thread(fake_engine.cancel_seen.wait, 10)
        fake_engine.hold = False
        await send(TTSSpeakFrame("Next one."))
        await down.until(stopped())

    down, up = await drive(service(gateway_on_fake), script)
    assert fake_engine.cancelled  # the model server's engine call was aborted
    assert await metric(gateway_on_fake, "gateway_cancels_total") == cancels_before + 1
    # only the next utterance's audio, to the byte: nothing late from the cancelled one
    assert len(audio_of(down)) == expected_pcm_bytes("Next one.")
    assert [w.text for w in words_of(down)] == ["Next", "one."]
    assert [f for f in up if isinstance(f, ErrorFrame)] == []


Log = list[tuple[str, dict[str, object]]]


class Wire:
    """What a service sends (`("sent", message)`, once on the socket) and the gateway's events
    it reads (`("got", event)`), in one list (`log`), in order."""

    def __init__(self) -> None:
        self.log: Log = []
        self._changed = asyncio.Event()

    def add(self, side: str, message: dict[str, object]) -> None:
        self.log.append((side, message))
        self._changed.set()

    async def until_speaks(self, n: int) -> None:
        """Wait until `n` speaks have been sent."""
        async with asyncio.timeout(10):
            while len(speaks(self.log)) < n:
                self._changed.clear()
                await self._changed.wait()


def record_wire(
    tts: KokoroVoiceTTSService,
    monkeypatch: pytest.MonkeyPatch,
    before_event: Callable[[dict[str, object]], Awaitable[None]] | None = None,
) -> Wire:
    """The service's messages and events, recorded; `before_event` runs before an event is
    handled (the receive loop waits for it)."""
    wire = Wire()
    send, on_event = tts._send, tts._on_event

    async def _send(messages: list[dict[str, object]]) -> None:
        await send(messages)
        for message in messages:
            wire.add("sent", message)

    async def _on_event(body: dict[str, object]) -> None:
        wire.add("got", body)
        if before_event is not None:
            await before_event(body)
        await on_event(body)

    monkeypatch.setattr(tts, "_send", _send)
    monkeypatch.setattr(tts, "_on_event", _on_event)
    return wire


def first(log: Log, side: str, kind: str, context_id: object = None) -> int:
    """The index of the first entry of `side` of type `kind` (naming `context_id`, if given)."""
    return next(
        i
        for i, (s, m) in enumerate(log)
        if s == side and m.get("type") == kind and context_id in (None, m.get("context_id"))
    )


def speaks(log: Log) -> list[object]:
    return [m["context_id"] for s, m in log if s == "sent" and m["type"] == "speak"]


async def test_the_next_turn_opens_while_the_last_ones_audio_is_still_coming(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No queue: the first turn is held in the engine (its audio has not ended), and the
    second turn's speak goes out on the same socket at once; both play whole, in order,
    each its own audio (routed by the context id of its frames)."""
    fake_engine.hold = True
    tts = service(gateway_on_fake)
    wire = record_wire(tts, monkeypatch)
    log = wire.log
    connections = itertools.count()

    async def _connected(tts: KokoroVoiceTTSService) -> None:
        next(connections)

    tts.add_event_handler("on_connected", _connected)
    texts = ["The first turn, held in the engine.", "The second turn."]

    async def script(send: Send, down: Tape, up: Tape) -> None:
        await send(TTSSpeakFrame(texts[0]))
        await down.until(lambda f: isinstance(f, TTSStartedFrame))
        assert await asyncio.to_thread(fake_engine.entered.wait, 10)  # synthesis runs now
        await send(TTSSpeakFrame(texts[1]))
        await wire.until_speaks(2)
        fake_engine.hold = False
        fake_engine.gate.set()
        await down.until(stopped())
        await down.until(stopped())

    down, up = await drive(tts, script)
    a, b = speaks(log)
    assert a != b
    # the second speak went out before the first context's audio had ended
    assert first(log, "sent", "speak", b) < first(log, "got", "audio_stream_end", a)
    assert first(log, "sent", "speak", b) < first(log, "got", "agent_end", a)
    assert next(connections) == 1  # one socket
    contexts = [str(f.context_id) for f in down if isinstance(f, TTSStartedFrame)]
    assert [utterance_id_for(c) for c in contexts] == [a, b]
    for context_id, spoken in zip(contexts, texts, strict=True):
        pcm = b"".join(
            f.audio for f in down if isinstance(f, TTSAudioRawFrame) and f.context_id == context_id
        )
        assert len(pcm) == expected_pcm_bytes(spoken)
    assert [w.text for w in words_of(down)] == " ".join(texts).split()
    assert [f for f in up if isinstance(f, ErrorFrame)] == []


async def test_a_barge_ins_next_turn_does_not_wait_for_cancelled(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interruption cancels the playing context, and the next turn's speak goes out
    without waiting for its `cancelled`: the service reads no `cancelled` until that speak
    is on the socket (with a client that waited, this would stall)."""
    fake_engine.hold = True
    tts = service(gateway_on_fake)
    next_speak = asyncio.Event()

    async def before_event(body: dict[str, object]) -> None:
        if body.get("type") == "cancelled":
            await asyncio.wait_for(next_speak.wait(), 10)

    wire = record_wire(tts, monkeypatch, before_event)
    log = wire.log

    async def script(send: Send, down: Tape, up: Tape) -> None:
        await send(TTSSpeakFrame("A long reply that keeps going. " * 4))
        await down.until(lambda f: isinstance(f, TTSStartedFrame))
        assert await asyncio.to_thread(fake_engine.entered.wait, 10)
        await send(InterruptionFrame())
        await send(TTSSpeakFrame("Next one."))
        await wire.until_speaks(2)
        next_speak.set()
        assert await asyncio.to_thread(fake_engine.cancel_seen.wait, 10)
        fake_engine.hold = False
        await down.until(stopped())

    down, up = await drive(tts, script)
    old, new = speaks(log)
    cancel = first(log, "sent", "cancel", old)
    assert cancel < first(log, "sent", "speak", new) < first(log, "got", "cancelled", old)
    assert fake_engine.cancelled  # the old context's engine call was aborted
    assert len(audio_of(down)) == expected_pcm_bytes("Next one.")  # nothing late of the old
    assert [w.text for w in words_of(down)] == ["Next", "one."]
    assert [f for f in up if isinstance(f, ErrorFrame)] == []


async def test_barge_in_cancels_every_open_context(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second speak frame comes while the first is held in the engine: it opens on the
    gateway at once; the interruption cancels both (each by its own id), neither's audio
    plays, and the turn after the barge-in does."""
    fake_engine.hold = True
    tts = service(gateway_on_fake)
    wire = record_wire(tts, monkeypatch)
    log = wire.log

    async def script(send: Send, down: Tape, up: Tape) -> None:
        await send(TTSSpeakFrame("The first reply, held in the engine."))
        await send(TTSSpeakFrame("Opened beside it."))
        await wire.until_speaks(2)
        assert await asyncio.to_thread(fake_engine.entered.wait, 10)
        await send(InterruptionFrame())
        assert await asyncio.to_thread(fake_engine.cancel_seen.wait, 10)
        fake_engine.hold = False
        await send(TTSSpeakFrame("After the barge-in."))
        await down.until(stopped())

    down, up = await drive(tts, script)
    a, b, _after = speaks(log)
    cancels = [m["context_id"] for s, m in log if s == "sent" and m["type"] == "cancel"]
    assert cancels == [a, b]
    assert any("After the barge-in." in call for call in fake_engine.calls)
    assert len(audio_of(down)) == expected_pcm_bytes("After the barge-in.")
    assert [f for f in up if isinstance(f, ErrorFrame)] == []


class ShiftedClock(SystemClock):
    """pipecat's clock, with time moved on at will: a listener who has heard everything the
    service pushed, without waiting for it."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.shift_ns = 0

    def get_time(self) -> int:
        return super().get_time() + self.shift_ns


async def test_barge_in_after_audio_says_how_much_was_played(
    gateway_on_fake: RunningServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """LLM text still streaming when the first chunk's audio has all arrived; the listener
    has played all of it (the clock moved past its end), so the interruption's cancel
    carries its length as `played_ms` (pipecat's clock from the first audio, never past what
    was pushed on), and the gateway answers with every word of it as heard."""
    from pipecat.frames.frames import LLMFullResponseStartFrame, LLMTextFrame

    tts = service(gateway_on_fake)
    clock = ShiftedClock()
    clock.start()  # type: ignore[no-untyped-call]
    monkeypatch.setattr(tts, "get_clock", lambda: clock)
    cancelled: list[tuple[object, object, object]] = []

    async def _cancelled(
        tts: KokoroVoiceTTSService, uid: object, played: object, heard: object
    ) -> None:
        cancelled.append((uid, played, heard))

    tts.add_event_handler("on_utterance_cancelled", _cancelled)
    first = "Hello there, my friend."  # the gateway's first chunk; the rest waits for more
    whole = expected_pcm_bytes(first)

    async def script(send: Send, down: Tape, up: Tape) -> None:
        await send(LLMFullResponseStartFrame())
        await send(LLMTextFrame(first + " "))
        await send(LLMTextFrame("Your order "))
        got = 0
        while got < whole:  # all of the first chunk's audio has come down
            frame = await down.until(lambda f: isinstance(f, TTSAudioRawFrame))
            got += len(frame.audio)  # type: ignore[attr-defined]
        assert got == whole
        clock.shift_ns = 60 * 1_000_000_000  # a minute on: everything pushed has played
        await send(InterruptionFrame())
        await send(TTSSpeakFrame("Next one."))
        await down.until(stopped())

    down, _ = await drive(tts, script)
    started = next(f for f in down if isinstance(f, TTSStartedFrame))
    assert cancelled == [(utterance_id_for(str(started.context_id)), round(whole / 48), first)]


async def test_a_gateway_error_is_an_error_frame_and_the_next_utterance_plays(
    gateway_on_fake: RunningServer,
) -> None:
    """An unknown voice: the gateway's `unknown_voice` error frame becomes an ErrorFrame (an
    invalid request: pipecat stops giving the service work until its settings change); a new
    voice, and the next utterance plays over the same connection."""
    tts = service(gateway_on_fake, voice="no_such_voice")
    connections: list[object] = []

    async def _connected(tts: KokoroVoiceTTSService) -> None:
        connections.append(tts)

    tts.add_event_handler("on_connected", _connected)

    async def script(send: Send, down: Tape, up: Tape) -> None:
        await send(TTSSpeakFrame("Not this one."))
        await up.until(lambda f: isinstance(f, ErrorFrame))
        await send(TTSUpdateSettingsFrame(delta=Settings(voice="jf_alpha")))
        await send(TTSSpeakFrame("This one."))
        await down.until(lambda f: isinstance(f, TTSAudioRawFrame))
        await down.until(stopped())

    down, up = await drive(tts, script)
    errors = [f for f in up if isinstance(f, ErrorFrame)]
    ours = [e for e in errors if isinstance(e.exception, KokoroVoiceError)]
    assert len(ours) == 1
    error = ours[0].exception
    assert isinstance(error, KokoroVoiceError)
    assert error.code == "unknown_voice"
    assert not error.retryable
    assert "unknown_voice" in ours[0].error
    assert "no_such_voice" in ours[0].error
    assert len(audio_of(down)) == expected_pcm_bytes("This one.")
    assert len(connections) == 1  # the connection survived the error


async def test_a_dropped_socket_reconnects(fake_server: RunningServer) -> None:
    """The gateway closes an idle socket (`idle_timeout`, close 1000): the service connects
    again by itself, and the next utterance plays on the new socket."""
    app = create_gateway(GatewaySettings(model_server_url=fake_server.http_url, idle_timeout_s=1.0))
    with serve(app) as gateway:
        tts = service(gateway)
        connected = [asyncio.Event(), asyncio.Event()]
        count = itertools.count()

        async def _connected(tts: KokoroVoiceTTSService) -> None:
            connected[min(next(count), 1)].set()

        tts.add_event_handler("on_connected", _connected)

        async def script(send: Send, down: Tape, up: Tape) -> None:
            await asyncio.wait_for(connected[1].wait(), 30)  # closed by the gateway, reopened
            await send(TTSSpeakFrame("After the reconnect."))
            await down.until(stopped())

        down, up = await drive(tts, script)
    assert len(audio_of(down)) == expected_pcm_bytes("After the reconnect.")
    assert [f for f in up if isinstance(f, ErrorFrame)] == []


async def test_a_slow_utterance_is_spoken_whole_however_long_the_gateway_is_quiet(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    """The model stalls after the first sentence (a busy machine), and the gateway is quiet
    for far longer than pipecat's idle wait (`stop_frame_timeout_s`, made short here so the
    stall need not last seconds); then the pipeline ends, as `run_test`'s does. The utterance
    is still the gateway's: its context waits for the rest and ends at `agent_end`, every
    byte and word there and no error, where the idle wait used to end it and drop the rest
    (the real-model test's audio cut short on a busy machine)."""
    text = "Hello there. How are you today?"
    fake_engine.hold_after = 1  # the second sentence waits in the engine until released
    tts = KokoroVoiceTTSService(url=gateway_on_fake.http_url, stop_frame_timeout_s=0.5)

    async def script(send: Send, down: Tape, up: Tape) -> None:
        await send(TTSSpeakFrame(text))
        assert await asyncio.to_thread(fake_engine.entered.wait, 10)  # the first one is done
        await asyncio.sleep(1.5)  # the fault: the model stalls, three idle waits long
        fake_engine.gate.set()  # the EndFrame that follows waits for the utterance's end

    down, up = await drive(tts, script)
    assert fake_engine.calls == ["Hello there.", "How are you today?"]
    assert len(audio_of(down)) == sum(expected_pcm_bytes(call) for call in fake_engine.calls)
    assert [w.text for w in words_of(down)] == text.split()
    assert [f for f in up if isinstance(f, ErrorFrame)] == []
    kinds = [type(f) for f in down if isinstance(f, TTSStartedFrame | TTSStoppedFrame)]
    assert kinds == [TTSStartedFrame, TTSStoppedFrame]


async def test_an_utterance_cut_short_by_a_lost_connection_is_an_error(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    """The network drops while an utterance plays: pipecat reconnects, and the utterance,
    its audio incomplete, is an ErrorFrame naming it rather than a silently short answer;
    the next one plays on the new socket."""
    fake_engine.hold = True  # the first utterance is mid-synthesis when the socket goes
    tts = service(gateway_on_fake)
    connected = connects(tts)

    async def script(send: Send, down: Tape, up: Tape) -> None:
        started, socket = await mid_utterance(tts, fake_engine, send, down)
        uid = tts._contexts.wire_id(str(started.context_id))
        assert uid is not None
        socket.transport.abort()  # the network drops: no close handshake
        await asyncio.wait_for(connected[1].wait(), 30)  # pipecat reconnected
        fake_engine.hold = False
        fake_engine.gate.set()
        await send(TTSSpeakFrame("After the drop."))
        await down.until(stopped())
        cut.append(uid)

    cut: list[str] = []
    down, up = await drive(tts, script)
    lost = [f.error for f in up if isinstance(f, ErrorFrame) and "lost before" in f.error]
    assert len(lost) == 1
    assert cut[0] in lost[0]
    assert len(audio_of(down)) == expected_pcm_bytes("After the drop.")


async def test_a_receive_loop_that_gave_up_is_started_again_with_the_next_socket(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    """Without pipecat's reconnect (`reconnect_on_error=False`) a dropped socket ends the
    receive loop: the utterance on it is an error at once (not a context left waiting for
    audio nobody reads), and the next one opens a socket and a receive loop with it. (The
    error comes before the loop has ended; the next utterance may connect while it still
    runs: the test after this one holds it there.)"""
    fake_engine.hold = True
    tts = KokoroVoiceTTSService(url=gateway_on_fake.http_url, reconnect_on_error=False)

    async def script(send: Send, down: Tape, up: Tape) -> None:
        _, socket = await mid_utterance(tts, fake_engine, send, down)
        socket.transport.abort()
        await up.until(lambda f: isinstance(f, ErrorFrame) and "lost before" in f.error)
        fake_engine.hold = False
        fake_engine.gate.set()
        await send(TTSSpeakFrame("On a new socket."))
        await down.until(stopped())

    down, _ = await drive(tts, script)
    assert len(audio_of(down)) == expected_pcm_bytes("On a new socket.")


class HeldError:
    """An `on_error` handler that holds the task reporting the first error whose text has
    `marker` until `release` is set (pipecat awaits these handlers in the task that reports
    the error, as an application's may: a slow log); `held` is set once it holds one."""

    def __init__(self, tts: KokoroVoiceTTSService, marker: str) -> None:
        self.marker = marker
        self.held = asyncio.Event()
        self.release = asyncio.Event()
        tts.add_event_handler("on_error", self._on_error)

    async def _on_error(self, processor: FrameProcessor, error: ErrorFrame) -> None:
        if self.marker in error.error and not self.held.is_set():
            self.held.set()
            await self.release.wait()


def connects(tts: KokoroVoiceTTSService) -> list[asyncio.Event]:
    """Set at the service's first and second connect. pipecat runs `on_connected` handlers
    as tasks, so by the time one is set the connect has returned and `_connect` has decided
    whether to start a receive loop."""
    connected = [asyncio.Event(), asyncio.Event()]
    count = itertools.count()

    async def _connected(tts: KokoroVoiceTTSService) -> None:
        connected[min(next(count), 1)].set()

    tts.add_event_handler("on_connected", _connected)
    return connected


async def mid_utterance(
    tts: KokoroVoiceTTSService, fake_engine: FakeEngine, send: Send, down: Tape
) -> tuple[TTSStartedFrame, Any]:
    """An utterance mid-synthesis (the engine held, `fake_engine.hold` on): its started frame
    and the socket it is on, for the test to drop."""
    await send(TTSSpeakFrame("Cut off in the middle."))
    started = await down.until(lambda f: isinstance(f, TTSStartedFrame))
    assert isinstance(started, TTSStartedFrame)
    assert await asyncio.to_thread(fake_engine.entered.wait, 10)
    socket = tts._websocket
    assert socket is not None
    return started, socket


async def test_a_receive_loop_on_its_way_out_reads_the_socket_opened_meanwhile(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    """The receive loop reports the utterance cut short, then gives up; the next utterance
    connects before it has ended (an `on_error` handler holds it in pipecat's report that it
    gives up). The connect starts no second loop beside the running one, and that one, let
    go, reads the new socket rather than end with no reader left for it: the utterance
    plays."""
    fake_engine.hold = True
    tts = KokoroVoiceTTSService(url=gateway_on_fake.http_url, reconnect_on_error=False)
    giving_up = HeldError(tts, "connection closed")
    connected = connects(tts)

    async def script(send: Send, down: Tape, up: Tape) -> None:
        _, socket = await mid_utterance(tts, fake_engine, send, down)
        socket.transport.abort()
        await up.until(lambda f: isinstance(f, ErrorFrame) and "lost before" in f.error)
        await asyncio.wait_for(giving_up.held.wait(), 30)  # the loop has not ended
        fake_engine.hold = False
        fake_engine.gate.set()
        await send(TTSSpeakFrame("On a new socket."))
        await asyncio.wait_for(connected[1].wait(), 30)  # it found the loop running
        giving_up.release.set()
        await down.until(stopped())

    down, _ = await drive(tts, script)
    assert len(audio_of(down)) == expected_pcm_bytes("On a new socket.")


@pytest.mark.parametrize("reconnect_on_error", [True, False])
async def test_a_socket_replaced_while_the_receive_loop_was_busy_is_read_next(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine, reconnect_on_error: bool
) -> None:
    """The socket drops while the receive loop is busy (an `on_error` handler holds it in an
    error it reports: the gateway's `unknown_context` for stray text), and the next utterance finds
    it closed first: its connect ends the utterance cut short and opens the next socket.
    The loop, let go, finds its socket replaced and reads the new one: no drop of its own to
    report, no reconnect (pipecat's would close the new socket and cut the utterance on it),
    and the utterance plays."""
    fake_engine.hold = True
    tts = KokoroVoiceTTSService(url=gateway_on_fake.http_url, reconnect_on_error=reconnect_on_error)
    busy = HeldError(tts, "unknown_context")
    connected = connects(tts)

    async def script(send: Send, down: Tape, up: Tape) -> None:
        started, socket = await mid_utterance(tts, fake_engine, send, down)
        cut.append(tts._contexts.wire_id(str(started.context_id)))
        await socket.send(json.dumps(text("stray", "x")))  # no such context: an error
        await asyncio.wait_for(busy.held.wait(), 30)
        socket.transport.abort()
        await socket.wait_closed()  # closed, and the loop has not seen it
        fake_engine.hold = False
        fake_engine.gate.set()
        await send(TTSSpeakFrame("On a new socket."))
        await asyncio.wait_for(connected[1].wait(), 30)
        busy.release.set()
        await down.until(stopped())

    cut: list[str | None] = []
    down, up = await drive(tts, script)
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    lost = [e for e in errors if "lost before" in e]
    assert len(lost) == 1
    assert f"utterance {cut[0]} " in lost[0]
    assert [e for e in errors if "connection closed" in e] == []
    assert len(audio_of(down)) == expected_pcm_bytes("On a new socket.")


async def test_connects_that_race_leave_one_socket_open(fake_server: RunningServer) -> None:
    """run_tts finding the socket gone connects while a reconnect (the receive task's) is
    closing the old one and opening the next: one connect at a time, so exactly one socket
    stays open, nothing is orphaned, and the next utterance plays."""
    app = create_gateway(GatewaySettings(model_server_url=fake_server.http_url))
    with serve(app) as gateway:
        tts = service(gateway)

        async def script(send: Send, down: Tape, up: Tape) -> None:
            await asyncio.gather(tts._reconnect_websocket(1), tts._connect())
            assert await wait_for_metric(gateway, "gateway_active_sessions", 1, transport="ws") == 1
            await send(TTSSpeakFrame("After the race."))
            await down.until(stopped())

        down, _ = await drive(tts, script)
        # the pipeline's end closed the one socket: none is left behind
        assert await wait_for_metric(gateway, "gateway_active_sessions", 0, transport="ws") == 0
    assert len(audio_of(down)) == expected_pcm_bytes("After the race.")


async def test_an_api_key_goes_as_a_bearer_and_a_wrong_one_is_an_error(
    fake_server: RunningServer,
) -> None:
    key = "k" * 32
    app = create_gateway(
        GatewaySettings(model_server_url=fake_server.http_url, api_keys=f"agent:{key}")
    )
    with serve(app) as gateway:
        good = KokoroVoiceTTSService(url=gateway.ws_url, api_key=key)
        down, up = await run_test(good, frames_to_send=[TTSSpeakFrame("With a key.")])
        assert len(audio_of(down)) == expected_pcm_bytes("With a key.")
        bad = KokoroVoiceTTSService(url=gateway.ws_url, api_key="x" * 32)
        down, up = await run_test(bad, frames_to_send=[], send_end_frame=True)
    errors = [f.error for f in up if isinstance(f, ErrorFrame)]
    assert errors
    assert "401" in errors[0]


# --- the plugin's wire rules, protocol 2, sans I/O (pipecat_kokoro_voice/wire.py) --------------

V = Voice("jf_alpha", 1.0)


def speak(cid: str) -> dict[str, object]:
    return {
        "type": "speak",
        "mode": "bidi",
        "format": "pcm",
        "voice": "jf_alpha",
        "speed": 1.0,
        "timestamps": True,
        "context_id": cid,
    }


def text(cid: str, delta: str) -> dict[str, object]:
    return {"type": "text", "context_id": cid, "delta": delta}


def test_utterance_ids_keep_to_the_gateways_alphabet() -> None:
    assert utterance_id_for("5f0c-1a") == "5f0c-1a"
    assert utterance_id_for("turn 1/ä") == "turn_1__"
    assert utterance_id_for("") == "utterance"
    long = utterance_id_for("x" * 100)
    assert long == "x" * 64
    assert utterance_id_for("x" * 100, {long}) == "x" * 62 + ".2"
    assert utterance_id_for("a", {"a", "a.2"}) == "a.3"


def test_the_speak_address_follows_the_gateway_url() -> None:
    assert speak_ws_url("http://127.0.0.1:8000") == "ws://127.0.0.1:8000/v1/speak/ws"
    assert speak_ws_url("https://voice.example/") == "wss://voice.example/v1/speak/ws"
    assert speak_ws_url("wss://voice.example/v1/speak/ws") == "wss://voice.example/v1/speak/ws"


def test_gateway_errors_say_whether_a_retry_may_help() -> None:
    from pipecat.utils.errors import ErrorCategory

    overloaded = KokoroVoiceError.from_frame(
        {
            "type": "error",
            "code": "overloaded",
            "message": "too busy",
            "retryable": True,
            "status": 503,
            "retry_after_s": 3,
            "utterance_id": "u1",
        }
    )
    assert overloaded.status == 503
    assert str(overloaded) == "overloaded: too busy (retryable after 3 s)"
    assert overloaded.utterance_id == "u1"
    assert overloaded.category is ErrorCategory.SERVER  # not permanent: pipecat keeps going
    voice = KokoroVoiceError.from_frame(
        {"code": "unknown_voice", "message": "no such voice", "status": 400}
    )
    assert str(voice) == "unknown_voice: no such voice"
    assert voice.category is ErrorCategory.INVALID_REQUEST
    assert KokoroVoiceError.from_frame({"code": "tts_not_ready"}).category is ErrorCategory.SERVER
    limited = KokoroVoiceError.from_frame({"code": "rate_limited", "status": 429})
    assert limited.category is ErrorCategory.RATE_LIMIT
    # a 400 that answers one message is no reason to stop giving the service work
    busy = KokoroVoiceError.from_frame({"code": "busy", "status": 400})
    assert busy.category is ErrorCategory.UNKNOWN


def test_a_context_opens_at_once_beside_one_playing() -> None:
    """No queue: a second context's speak goes out with its first text while the first one
    still plays, and each message names its context."""
    t = ContextTable()
    assert t.text("a", "Hello ", V) == [speak("a"), text("a", "Hello ")]
    assert t.text("a", "there.", V) == [text("a", "there.")]
    assert t.text("b", "Next.", V) == [speak("b"), text("b", "Next.")]  # "a" still plays
    assert t.close("b") == [{"type": "close_context", "context_id": "b"}]
    assert t.close("a") == [{"type": "close_context", "context_id": "a"}]
    assert t.close("a") == []  # once is enough
    assert t.open == ["a", "b"]
    ended = t.ended("a")
    assert ended == Ended("a", cancelled=False)
    assert t.open == ["b"]
    assert t.text("a", "more", V) == []  # its context is over: nowhere to go


def test_pipecats_ids_are_made_safe_on_the_wire() -> None:
    t = ContextTable()
    assert t.text("turn 1/ä", "Hi.", V) == [speak("turn_1__"), text("turn_1__", "Hi.")]
    assert t.wire_id("turn 1/ä") == "turn_1__"
    assert t.audio(b"\x08turn_1__\x01\x00") == ("turn 1/ä", b"\x01\x00")
    assert t.owner("turn_1__") == "turn 1/ä"
    assert t.text("turn 1?ä", "Hi.", V)[0] == speak("turn_1__.2")  # another context, its own id


def test_a_context_is_the_gateways_to_end_until_it_ends() -> None:
    """Sent, or opened on an open connection: the gateway ends it, however quiet it is
    meanwhile. Ended, being cancelled, or held with no socket: not."""
    t = ContextTable()
    t.text("a", "Playing.", V)
    t.text("b", "Beside it.", V)
    assert t.carries("a")
    assert t.carries("b")
    assert not t.carries("z")
    assert t.on_wire() == ["a", "b"]  # what a lost connection would cut short
    assert t.ended("a") is not None
    assert not t.carries("a")
    assert t.on_wire() == ["b"]
    t.cancel("b")
    assert not t.carries("b")
    assert t.on_wire() == []
    offline = ContextTable(online=False)
    offline.text("c", "Held.", V)
    assert not offline.carries("c")  # nothing may ever send it
    assert offline.on_wire() == []
    offline.connected()
    assert offline.carries("c")
    assert offline.on_wire() == ["c"]


def test_audio_goes_to_its_context_by_prefix_whole_samples_only() -> None:
    t = ContextTable()
    t.text("a", "Hi.", V)
    t.text("b", "Yo.", V)
    assert t.audio(b"\x01a\x01\x02\x03") == ("a", b"\x01\x02")
    assert t.audio(b"\x01b\x07\x08") == ("b", b"\x07\x08")  # interleaved: each its own
    assert t.audio(b"\x01a\x04") == ("a", b"\x03\x04")  # the odd byte carried over
    assert t.audio(b"\x01z\x00\x00") is None  # no such context
    with pytest.raises(ValueError, match="shorter"):
        t.audio(b"\x05ab")


def test_a_barge_ins_next_turn_opens_before_cancelled_and_late_audio_is_dropped() -> None:
    t = ContextTable()
    t.text("a", "A long one.", V)
    assert t.cancel("a", 1234.4) == [{"type": "cancel", "context_id": "a", "played_ms": 1234}]
    assert t.cancel("a") == []  # once
    assert t.close("a") == []  # nothing more for a cancelled context
    # the next turn goes out at once: the old one's `cancelled` has not come yet
    assert t.text("b", "New.", V) == [speak("b"), text("b", "New.")]
    assert t.audio(b"\x01a\x00\x00") is None  # the cancelled one's late audio
    assert t.owner("a") is None
    assert t.audio(b"\x01b\x00\x00") == ("b", b"\x00\x00")
    assert t.ended("a") == Ended("a", cancelled=True)
    assert t.open == ["b"]


def test_a_context_never_sent_is_dropped_by_a_cancel() -> None:
    t = ContextTable(online=False)
    t.text("a", "Held.", V)
    assert t.cancel("a") == []
    assert t.connected() == []
    assert t.text("a", "more", V) == []


def test_a_cancel_that_crosses_the_contexts_end_is_not_an_error() -> None:
    t = ContextTable()
    t.text("a", "Short.", V)
    t.owner("a")  # agent_start
    t.cancel("a")
    assert t.ended("a") == Ended("a", cancelled=True)  # agent_end was already on its way
    gone = {"type": "error", "code": "unknown_context", "context_id": "a"}
    assert t.error(gone) == (False, None)  # the gateway's answer to the cancel
    # one naming a context never seen is the gateway's news: reported
    assert t.error({**gone, "context_id": "z"}) == (True, None)


def test_a_refused_speak_ends_its_context_and_its_text_is_not_reported() -> None:
    t = ContextTable()
    t.text("a", "Not ", V)
    t.text("a", "this.", V)
    t.close("a")
    t.text("b", "Next.", V)
    refused = {"type": "error", "code": "unknown_voice", "context_id": "a", "status": 400}
    assert t.error(refused) == (True, Ended("a", cancelled=False))
    assert t.open == ["b"]  # the other context goes on
    for code in ("unknown_context", "unknown_context", "unknown_context"):  # text, close
        assert t.error({"type": "error", "code": code, "context_id": "a"}) == (False, None)
    full = {"type": "error", "code": "too_many_contexts", "context_id": "b", "status": 429}
    assert t.error(full) == (True, Ended("b", cancelled=False))


def test_a_speak_refused_without_its_id_ends_at_its_texts_unknown_context() -> None:
    """A speak that did not parse is refused by an error naming no context (reported); the
    text after it is answered `unknown_context` naming it: that ends it, quietly."""
    t = ContextTable()
    t.text("a", "Too fast.", V)
    assert t.error({"type": "error", "code": "invalid_field", "status": 400}) == (True, None)
    assert t.carries("a")
    assert t.error({"type": "error", "code": "unknown_context", "context_id": "a"}) == (
        False,
        Ended("a", cancelled=False),
    )


def test_an_error_during_a_reply_waits_for_its_end() -> None:
    t = ContextTable()
    t.text("a", "Hi.", V)
    assert t.owner("a") == "a"  # agent_start: the reply runs
    failed = {"type": "error", "code": "tts_synthesis_failed", "context_id": "a"}
    assert t.error(failed) == (True, None)
    assert t.open == ["a"]
    long = {"type": "error", "code": "text_too_long", "context_id": "a"}
    assert t.error(long) == (True, None)  # the delta was dropped, the rest goes on
    assert t.open == ["a"]
    assert t.ended("a") == Ended("a", cancelled=False)


def test_an_error_closing_the_connection_is_left_to_the_connections_loss() -> None:
    t = ContextTable()
    t.text("a", "Hi.", V)
    closing = {"type": "error", "code": "max_connection_age", "context_id": "a"}
    assert t.error(closing) == (True, None)
    assert t.open == ["a"]


def test_a_lost_connection_forgets_every_context_sent() -> None:
    t = ContextTable()
    t.text("a", "One.", V)
    t.text("b", "Two.", V)
    assert t.connection_lost() == ["a", "b"]
    assert t.open == []
    assert t.text("c", "Three.", V) == []  # no socket: held
    assert t.connected() == [speak("c"), text("c", "Three.")]


def test_text_and_close_with_no_socket_go_out_once_connected() -> None:
    """A socket gone before anyone reopened it: the contexts on it are lost, the ones never
    sent wait (with `keep_unsent`), and so does new text and its end, in the order they
    opened."""
    t = ContextTable(online=False)
    t.text("b", "Held ", V)
    t.text("c", "Also held.", V)
    t.online = True
    t.text("a", "On the wire.", V)  # (a socket came without `connected()`: sent at once)
    assert t.connection_lost(keep_unsent=True) == ["a"]
    assert t.text("b", "with no socket.", V) == []
    assert t.close("b") == []
    assert t.connected() == [
        speak("b"),
        text("b", "Held "),
        text("b", "with no socket."),
        {"type": "close_context", "context_id": "b"},
        speak("c"),
        text("c", "Also held."),
    ]
    assert t.close("b") == []  # once is enough


def test_a_gateway_without_protocol_2_ends_every_context_sent() -> None:
    """A gateway before protocol 2 takes the socket for protocol 1: it refuses each speak
    (naming no context) and answers `close_context` with `unknown_type`: every context sent
    ends there, rather than waiting for audio that never comes."""
    t = ContextTable()
    t.text("a", "One.", V)
    t.close("a")
    t.text("b", "Two.", V)
    old = {"type": "error", "code": "unknown_type", "message": "unknown message type"}
    assert t.not_protocol_2({**old, "context_id": "a"}) == []  # protocol 2's own: not this
    assert t.not_protocol_2({"type": "error", "code": "invalid_field"}) == []
    assert t.open == ["a", "b"]
    assert t.not_protocol_2(old) == [Ended("a", False), Ended("b", False)]
    assert t.open == []


async def test_a_gateway_speaking_only_protocol_1_is_one_clear_error_not_a_stall(
    gateway_on_fake: RunningServer,
) -> None:
    """Pointed at protocol 1 (as a gateway before protocol 2 serves `?protocol=2`): the turn
    ends with an ErrorFrame saying the gateway lacks protocol 2, and the pipeline ends."""
    tts = service(gateway_on_fake)
    tts._url = speak_ws_url(gateway_on_fake.http_url)  # protocol 1
    down, up = await run_test(tts, frames_to_send=[TTSSpeakFrame("Hello.")])
    assert audio_of(down) == b""
    assert any("protocol 2" in f.error for f in up if isinstance(f, ErrorFrame))


async def test_a_flush_that_finds_no_socket_is_kept_for_the_next_one() -> None:
    """pipecat's flush arrives while there is no socket (before a reconnect): the service
    marks the context closed, so it goes out with its speak and text, and the gateway
    ends it, instead of waiting out pipecat's stop timeout."""
    tts = KokoroVoiceTTSService(url="http://127.0.0.1:1")  # never connected
    assert tts._url == "ws://127.0.0.1:1/v1/speak/ws?protocol=2"
    assert tts._contexts.text("ctx", "Hello.", V) == []
    await tts.flush_audio("ctx")
    assert tts._contexts.connected() == [
        speak("ctx"),
        text("ctx", "Hello."),
        {"type": "close_context", "context_id": "ctx"},
    ]


@pytest.mark.real_model
async def test_the_real_model_speaks_through_the_plugin(gateway_server: RunningServer) -> None:
    text = "Hello there. How are you today?"
    down, up = await run_test(service(gateway_server), frames_to_send=[TTSSpeakFrame(text)])
    assert [f for f in up if isinstance(f, ErrorFrame)] == []
    pcm = audio_of(down)
    assert len(pcm) % 2 == 0
    assert len(pcm) > 24_000 * 2 * 1.0  # over a second of speech for seven words
    assert loud(pcm)
    words = words_of(down)
    assert [w.text for w in words] == text.split()
    pts = [w.pts or 0 for w in words]
    assert pts == sorted(pts)
    assert pts[-1] > pts[0]


async def test_a_failing_script_stops_the_pipeline_it_drives() -> None:
    """The frameworks' bench (and `drive` above): when what feeds the pipeline fails, the
    runner is cancelled and the failure raised, rather than the pipeline left running with
    nobody to send its EndFrame."""
    from pipecat.processors.filters.identity_filter import IdentityFilter

    passthrough = IdentityFilter()  # type: ignore[no-untyped-call]
    worker = PipelineWorker(Pipeline([passthrough]), cancel_on_idle_timeout=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)

    async def feed() -> None:
        raise RuntimeError("the feed failed")

    with pytest.raises(RuntimeError, match="the feed failed"):
        await run_with(runner, feed())


# --- pipecat's own OpenAITTSService against /v1/audio/speech -------------------------------


@pytest.mark.parametrize("voice", ["alloy", "marin"])
async def test_pipecats_openai_tts_speaks_through_the_gateway(
    gateway_on_fake: RunningServer, voice: str
) -> None:
    from pipecat.services.openai.tts import OpenAITTSService

    tts = OpenAITTSService(
        api_key="unused",
        base_url=gateway_on_fake.http_url + "/v1",
        settings=OpenAITTSService.Settings(voice=voice),
    )
    text = "Hello from pipecat."
    down, up = await run_test(tts, frames_to_send=[TTSSpeakFrame(text)])
    assert [f for f in up if isinstance(f, ErrorFrame)] == []
    pcm = audio_of(down)
    assert len(pcm) == expected_pcm_bytes(text)  # the whole utterance, 24 kHz s16
    assert loud(pcm)


@pytest.mark.slow
async def test_an_unknown_voice_through_openai_is_a_clear_error(
    gateway_on_fake: RunningServer,
) -> None:
    """pipecat's OpenAI class refuses a name OpenAI lacks before asking; the gateway, asked
    with one anyway (the same SDK pipecat uses), answers 400 unknown_voice naming its voices."""
    import openai
    from pipecat.services.openai.tts import OpenAITTSService

    tts = OpenAITTSService(
        api_key="unused",
        base_url=gateway_on_fake.http_url + "/v1",
        settings=OpenAITTSService.Settings(voice="no_such_voice"),
    )
    down, up = await run_test(tts, frames_to_send=[TTSSpeakFrame("Hello.")])
    assert audio_of(down) == b""
    assert any(
        "no_such_voice" in f.error and "alloy" in f.error for f in up if isinstance(f, ErrorFrame)
    )
    client = openai.AsyncOpenAI(api_key="unused", base_url=gateway_on_fake.http_url + "/v1")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.speech.create(
            model="gpt-4o-mini-tts",
            voice="no_such_voice",
            input="Hello.",
            response_format="pcm",
        )
    assert refused.value.status_code == 400
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["code"] == "unknown_voice"
    assert "jf_alpha" in body["message"]
