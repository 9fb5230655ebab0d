"""The reply pipeline over in-memory transports: ordering and failure, without servers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable

import pytest

from gateway.encoders import create_encoder
from gateway.params import Mode
from gateway.reply.events import AgentEnd, AudioChunk, ErrorEvent, Event, Flushed, TextDelta
from gateway.reply.pipeline import Reply, ReplySpec
from gateway.reply.plan import playback_plan
from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.reply.plan.protocol import UNFINISHED_MAX, Chunk
from gateway.reply.plan.rates import EarlyAudio, SpeechRate
from gateway.reply.plan.sentence_plan import SentencePlan, client_plan
from gateway.reply.plan.timeline import Inputs, Timeline, build
from gateway.sources.base import FlushMark
from gateway.sources.client import ClientTextSource
from gateway.transports.base import Completed, OnComplete
from kokoro_contract.formats import FORMATS
from kokoro_contract.protocol import TextOptions
from kokoro_contract.speed import SpeedModel
from tests.support.steps import until

PCM_PER_CHUNK = b"\x01\x00" * 2400  # 0.1 s


class GatedSource:
    """Yields its first deltas, then waits for `gate` before the rest."""

    def __init__(self, first: list[str], rest: list[str]) -> None:
        self.first, self.rest = first, rest
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()

    async def stream(self) -> AsyncGenerator[str]:
        for delta in self.first:
            yield delta
        self.waiting.set()
        await self.gate.wait()
        for delta in self.rest:
            yield delta


class MemoryStream:
    def __init__(self, fail: bool) -> None:
        self.sent: list[str] = []
        self.fail = fail
        self._audio: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        self.sent.append(text)
        await self._audio.put(PCM_PER_CHUNK)

    async def end_input(self) -> None:
        await self._audio.put(None)

    async def audio(self) -> AsyncIterator[bytes]:
        while (pcm := await self._audio.get()) is not None:
            if self.fail:
                raise RuntimeError("a bug in a transport")
            yield pcm


class MemoryTransport:
    def __init__(self, fail: bool = False, source: GatedSource | None = None) -> None:
        self.stream = MemoryStream(fail)
        self.source = source
        self.batch_calls: list[tuple[str, bool]] = []  # (text, whether the source was done)

    @contextlib.asynccontextmanager
    async def open(
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncIterator[MemoryStream]:
        yield self.stream

    async def synthesize(
        self,
        text: str,
        voice: str | None,
        speed: float,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncGenerator[bytes]:
        self.batch_calls.append((text, self.source is not None and self.source.gate.is_set()))
        yield PCM_PER_CHUNK


def make_reply(
    mode: Mode,
    source: GatedSource,
    transport: MemoryTransport,
    on_end: Callable[[], None] | None = None,
) -> tuple[Reply, asyncio.Queue[Event | None]]:
    out: asyncio.Queue[Event | None] = asyncio.Queue()
    spec = ReplySpec("u1", mode, FORMATS["pcm"], None, 1.0)
    encoder = create_encoder(spec.format)
    return Reply(spec, source, encoder, transport, transport, out, on_end=on_end), out


def drain(out: asyncio.Queue[Event | None]) -> list[Event]:
    events = []
    while not out.empty():
        event = out.get_nowait()
        if event is not None:
            events.append(event)
    return events


async def test_bidi_sends_and_plays_the_first_sentence_while_the_source_still_writes() -> None:
    source = GatedSource(["Hello there. ", "And then "], ["more text follows."])
    transport = MemoryTransport()
    reply, out = make_reply(Mode.BIDI, source, transport)
    task = asyncio.create_task(reply.run())
    so_far: list[Event] = []
    while not so_far or not isinstance(so_far[-1], AudioChunk):
        event = await out.get()  # audio arrives while the source is still held at its gate
        assert event is not None
        so_far.append(event)
    assert not source.gate.is_set()
    assert transport.stream.sent == ["Hello there."]
    source.gate.set()
    await task
    events = so_far + drain(out)
    assert transport.stream.sent == ["Hello there.", "And then more text follows."]
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == (
        "Hello there. And then more text follows."
    )
    assert sum(len(e.data) for e in events if isinstance(e, AudioChunk)) == 2 * len(PCM_PER_CHUNK)
    assert isinstance(events[-1], AgentEnd)


async def test_batch_waits_for_all_the_text() -> None:
    source = GatedSource(["Hello there. "], ["All of it."])
    transport = MemoryTransport(source=source)
    reply, out = make_reply(Mode.BATCH, source, transport)
    task = asyncio.create_task(reply.run())
    await source.waiting.wait()  # the first sentence is out; the rest is held
    source.gate.set()
    await task
    # one call, made after the source had given everything (bidi would have sent the first
    # sentence while the rest was held)
    assert transport.batch_calls == [("Hello there. All of it.", True)]
    audio = [e for e in drain(out) if isinstance(e, AudioChunk)]
    assert sum(len(e.data) for e in audio) == len(PCM_PER_CHUNK)


async def test_an_unexpected_failure_ends_the_reply_with_a_generic_error() -> None:
    source = GatedSource(["Hello there."], [])
    source.gate.set()
    reply, out = make_reply(Mode.BIDI, source, MemoryTransport(fail=True))
    await reply.run()
    events = drain(out)
    errors = [e for e in events if isinstance(e, ErrorEvent)]
    assert errors == [ErrorEvent("internal_error", "the reply failed on the server", False)]
    assert isinstance(events[-1], AgentEnd)


async def _settled_at(fail: bool) -> tuple[list[Event], list[int]]:
    """A reply's events, and how many were out each time its `on_end` was called."""
    source = GatedSource(["Hello there."], [])
    source.gate.set()
    out_when_settled: list[int] = []
    reply, out = make_reply(
        Mode.BIDI,
        source,
        MemoryTransport(fail=fail),
        on_end=lambda: out_when_settled.append(out.qsize()),
    )
    await reply.run()
    return drain(out), out_when_settled


async def test_the_reply_settles_before_its_end_reaches_the_client() -> None:
    """`on_end` (the gate charging an LLM answer's tokens) runs before `agent_end` is out:
    a client that sends its next request as it reads the end finds the charge made. Also on a
    reply that failed."""
    for fail in (False, True):
        events, out_when_settled = await _settled_at(fail)
        assert isinstance(events[-1], AgentEnd)
        # called once, when everything but agent_end (and the closing None) was out
        assert out_when_settled == [len(events) - 1]


class HeldStream:
    """A TTS stream whose chunks' audio come only when the test lets each one through, each
    reported complete (as the model server's `synthesis_complete`) after its audio."""

    def __init__(self, on_complete: OnComplete) -> None:
        self.on_complete = on_complete
        self.sent: list[str] = []
        self.gates: list[asyncio.Event] = []
        self.waiting = asyncio.Event()  # set while the stream waits for a closed gate
        self.waiting_on: int | None = None  # the chunk whose gate it waits for
        self.done = 0  # chunks reported complete
        self.most_unfinished = 0  # the most chunks sent and not complete at once
        self._arrived = asyncio.Event()
        self._ended = False

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        self.sent.append(text)
        self.most_unfinished = max(self.most_unfinished, len(self.sent) - self.done)
        self.gates.append(asyncio.Event())
        self._arrived.set()

    async def end_input(self) -> None:
        self._ended = True
        self._arrived.set()

    async def audio(self) -> AsyncIterator[bytes]:
        index = 0
        while True:
            while index >= len(self.sent) and not self._ended:
                self._arrived.clear()
                await self._arrived.wait()
            if index >= len(self.sent):
                return
            if not self.gates[index].is_set():
                self.waiting.set()
                self.waiting_on = index
                await self.gates[index].wait()
                self.waiting.clear()
                self.waiting_on = None
            yield PCM_PER_CHUNK
            self.done += 1
            self.on_complete(Completed(index, len(self.sent[index]), len(PCM_PER_CHUNK), 5.0))
            index += 1


class StreamTransport[S](MemoryTransport):
    """A transport whose one stream the test makes (`make`, given the reply's completion
    callback) and then drives: `opened`, once the reply has opened it."""

    def __init__(self, make: Callable[[OnComplete], S]) -> None:
        super().__init__()
        self.make = make
        self.opened: S | None = None

    @contextlib.asynccontextmanager
    async def open(  # type: ignore[override]
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncIterator[S]:
        assert on_complete is not None
        self.opened = self.make(on_complete)
        yield self.opened


async def test_the_first_audio_waits_until_the_chunk_after_it_is_ready_in_time() -> None:
    # an engine estimated at 5 s a chunk: the second cannot follow 0.1 s of audio in time,
    # so the first audio is held (up to an hour here) until the second is there
    config = PlanConfig(first_hold_s=3600.0)

    plan = ChunkPlan(config, SpeedModel(prior_a=5.0, prior_b=0.0), SpeechRate())

    source = GatedSource(["Sure, I can help you with that right away."], [])
    source.gate.set()
    transport = StreamTransport(HeldStream)
    out: asyncio.Queue[Event | None] = asyncio.Queue()
    spec = ReplySpec("u1", Mode.BIDI, FORMATS["pcm"], None, 1.0)
    reply = Reply(spec, source, create_encoder(spec.format), transport, transport, out, plan=plan)
    task = asyncio.create_task(reply.run())
    await until(lambda: transport.opened is not None and bool(transport.opened.sent))
    stream = transport.opened
    assert stream is not None
    assert stream.sent == ["Sure, I can help you"]  # the next waits for the engine (5 s)
    stream.gates[0].set()  # the first chunk is done, sooner: the next goes at once
    held = len(PCM_PER_CHUNK)  # the first chunk's audio, taken from the stream and held
    await until(
        lambda: len(stream.sent) == 2 and stream.waiting.is_set() and reply.held_bytes == held
    )
    assert stream.sent == ["Sure, I can help you", "with that right away."]
    assert not any(isinstance(e, AudioChunk) for e in drain(out))  # its audio is held
    stream.gates[1].set()  # the second is ready: both play, the first first
    await task
    audio = [e for e in drain(out) if isinstance(e, AudioChunk)]
    assert b"".join(e.data for e in audio) == PCM_PER_CHUNK * 2
    assert reply.metrics.pcm_bytes == 2 * len(PCM_PER_CHUNK)


class PiecedStream:
    """A TTS stream whose audio comes piece by piece as the test puts it in `pieces` (None: the
    end), with nothing reported complete."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.pieces: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        self.sent.append(text)

    async def end_input(self) -> None:
        pass

    async def audio(self) -> AsyncIterator[bytes]:
        while (pcm := await self.pieces.get()) is not None:
            yield pcm


class PiecedTransport(MemoryTransport):
    def __init__(self) -> None:
        super().__init__()
        self.pieced = PiecedStream()

    @contextlib.asynccontextmanager
    async def open(  # type: ignore[override]
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncIterator[PiecedStream]:
        yield self.pieced


async def test_a_held_first_audio_computes_the_plans_timeline_once_not_per_piece(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The playback processor asks the plan of every piece while it holds the first audio
    (`audio_ready`, `release_at`): the plan's timeline is computed for the first piece (the
    first audio is here), and for no piece after it."""
    builds: list[float] = []

    def counted(inputs: Inputs, now: float) -> Timeline:
        builds.append(now)
        return build(inputs, now)

    monkeypatch.setattr(playback_plan, "build", counted)
    # a progressive engine estimated at 5 s a chunk, its first audio at 0.25 s: what follows
    # cannot keep up, the first audio is held (up to an hour here) while the rest comes
    config = PlanConfig(first_hold_s=3600.0)
    first = SpeedModel(prior_a=0.25, prior_b=0.0)
    speed = SpeedModel(prior_a=5.0, prior_b=0.0)
    plan = ChunkPlan(config, speed, SpeechRate(), 1.0, first, EarlyAudio(0.6))
    source = GatedSource(["Sure, I can help you with that right away."], [])
    source.gate.set()
    transport = PiecedTransport()
    stream = transport.pieced
    out: asyncio.Queue[Event | None] = asyncio.Queue()
    spec = ReplySpec("u1", Mode.BIDI, FORMATS["pcm"], None, 1.0)
    reply = Reply(spec, source, create_encoder(spec.format), transport, transport, out, plan=plan)
    task = asyncio.create_task(reply.run())
    await until(lambda: stream.sent == ["Sure, I can help you"] and plan.unsent)
    piece = PCM_PER_CHUNK[:480]  # 10 ms
    stream.pieces.put_nowait(piece)
    await until(lambda: reply.held_bytes == len(piece))
    computed = len(builds)
    assert computed > 0
    for count in range(2, 41):
        stream.pieces.put_nowait(piece)
        await until(lambda: reply.held_bytes == count * len(piece))  # noqa: B023
    assert len(builds) == computed
    assert not any(isinstance(e, AudioChunk) for e in drain(out))  # all of it held
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_reply_whose_engine_is_far_behind_keeps_its_text_past_a_few_chunks() -> None:
    """The model server's session refuses requests past its limit (`too_many_pending`): while
    its engine is behind, a reply keeps the rest of its text once `UNFINISHED_MAX` chunks are
    unfinished, until one completes, however fast the text came (here all at once, to the
    `sentences` plan that sends each sentence)."""
    text = 2 * (
        "Your order shipped yesterday from our warehouse in Portland. It should arrive by "
        "Thursday afternoon at the latest. You will get a tracking link by email within the "
        "hour. The courier will call you before they come. Is there anything else I can do? "
    )
    source = GatedSource([text], [])
    source.gate.set()
    transport = StreamTransport(HeldStream)
    out: asyncio.Queue[Event | None] = asyncio.Queue()
    spec = ReplySpec("u1", Mode.BIDI, FORMATS["pcm"], None, 1.0)
    plan = SentencePlan()
    reply = Reply(spec, source, create_encoder(spec.format), transport, transport, out, plan=plan)
    task = asyncio.create_task(reply.run())
    await until(lambda: transport.opened is not None)
    stream = transport.opened
    assert stream is not None
    opened = 0

    def waited_on_or_done() -> bool:
        return task.done() or stream.waiting_on == opened

    while not task.done():  # the engine finishes one chunk at a time, when it is waited on
        await until(waited_on_or_done)
        if stream.waiting_on == opened:
            assert len(stream.sent) - stream.done <= UNFINISHED_MAX
            stream.gates[opened].set()
            opened += 1
    await task
    assert stream.most_unfinished == UNFINISHED_MAX
    assert len(stream.sent) == opened > UNFINISHED_MAX + 2
    assert " ".join(stream.sent) == text.strip()
    audio = [e for e in drain(out) if isinstance(e, AudioChunk)]
    assert b"".join(e.data for e in audio) == PCM_PER_CHUNK * opened


class RecordingPlan(SentencePlan):
    """The sentences plan, noting what the reply asks of it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def push(self, text: str, now: float) -> list[Chunk]:
        self.calls.append("push")
        return super().push(text, now)

    def flush(self, now: float) -> list[Chunk]:
        self.calls.append("flush")
        return super().flush(now)

    def tick(self, now: float) -> list[Chunk]:
        self.calls.append("tick")
        return super().tick(now)

    def completed(
        self,
        index: int,
        audio_s: float,
        now: float,
        synth_s: float | None = None,
        first_s: float | None = None,
        early_s: float | None = None,
    ) -> None:
        self.calls.append(f"completed {index}")
        super().completed(index, audio_s, now, synth_s, first_s, early_s)


class CountingSource:
    """Gives its deltas as fast as they are taken, counting them."""

    def __init__(self, deltas: list[str]) -> None:
        self.deltas = deltas
        self.given = 0

    async def stream(self) -> AsyncGenerator[str]:
        for delta in self.deltas:
            self.given += 1
            yield delta


class SlowSendStream:
    """A TTS stream whose first send waits until the test lets it go (a session being opened
    again, a socket that takes nothing); each chunk's audio comes once the input has ended."""

    def __init__(self, on_complete: OnComplete) -> None:
        self.on_complete = on_complete
        self.sent: list[str] = []
        self.go = asyncio.Event()
        self._ended = asyncio.Event()

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        self.sent.append(text)
        if len(self.sent) == 1:
            await self.go.wait()

    async def end_input(self) -> None:
        self._ended.set()

    async def audio(self) -> AsyncIterator[bytes]:
        await self._ended.wait()
        for _ in self.sent:
            yield PCM_PER_CHUNK


async def test_a_completion_reaches_the_plan_while_the_text_queue_is_full() -> None:
    """A chunk completes while the plan's processor is held in a send and the text waiting
    for it fills its queue: the plan is told, and asked again (`tick`) as soon as the send
    returns, not only when the next text comes (a wake put in a full queue was lost)."""
    text = ["Hello there. ", "How are you? ", "I am fine. ", "It is sunny. ", "Bye now. ", "Ok."]
    source = CountingSource(text)
    transport = StreamTransport(SlowSendStream)
    plan = RecordingPlan()
    out: asyncio.Queue[Event | None] = asyncio.Queue()
    spec = ReplySpec("u1", Mode.BIDI, FORMATS["pcm"], None, 1.0)
    reply = Reply(spec, source, create_encoder(spec.format), transport, transport, out, plan=plan)
    task = asyncio.create_task(reply.run())
    # the first chunk's send is held; the text read meanwhile fills the queue (one delta), and
    # the reader waits with the next: the source has given two more than the plan has taken
    await until(
        lambda: (
            transport.opened is not None
            and len(transport.opened.sent) == 1
            and source.given == plan.calls.count("push") + 2
        )
    )
    stream = transport.opened
    assert stream is not None
    stream.on_complete(Completed(0, len(stream.sent[0]), len(PCM_PER_CHUNK), 0.2))
    assert "completed 0" in plan.calls  # told at once
    stream.go.set()
    await task
    after = plan.calls[plan.calls.index("completed 0") :]
    assert after[1] == "tick"  # asked again before it takes the text that waited
    audio = [e for e in drain(out) if isinstance(e, AudioChunk)]
    assert b"".join(e.data for e in audio) == PCM_PER_CHUNK * len(stream.sent)
    assert " ".join(stream.sent) == "".join(text).strip()


class CompletingStream:
    """A TTS stream that gives each chunk's audio when the test releases it, in pieces, and
    tells its completion after the last of them, as the model server's sessions do."""

    def __init__(self, on_complete: OnComplete) -> None:
        self.on_complete = on_complete
        self.sent: list[str] = []
        self._released: asyncio.Queue[int | None] = asyncio.Queue()

    async def send(self, text: str, deadline_ms: float | None = None) -> None:
        self.sent.append(text)

    async def end_input(self) -> None:
        await self._released.put(None)

    def release(self, pieces: int) -> None:
        self._released.put_nowait(pieces)

    async def audio(self) -> AsyncIterator[bytes]:
        index = 0
        while (pieces := await self._released.get()) is not None:
            for _ in range(pieces):
                yield PCM_PER_CHUNK
            done = Completed(index, len(self.sent[index]), pieces * len(PCM_PER_CHUNK), 0.01)
            self.on_complete(done)
            index += 1


async def test_a_flush_is_answered_right_after_the_audio_up_to_it() -> None:
    """The client's flushes (protocol 2) with its own buffering: what came before each goes
    as one chunk; `flushed` follows the last audio of the chunk that holds the flush's text,
    before any audio of the next, in the order the flushes came; a flush with no id is
    answered by nothing."""
    source = ClientTextSource()
    items: list[str | FlushMark] = [
        "Hello ",
        "there. ",
        FlushMark("f1"),
        "How are",
        FlushMark(None),
    ]
    for item in items:
        assert source.offer(item)
    assert source.offer(FlushMark(2))
    transport = StreamTransport(CompletingStream)
    out: asyncio.Queue[Event | None] = asyncio.Queue()
    spec = ReplySpec("c1", Mode.BIDI, FORMATS["pcm"], None, 1.0)
    plan = client_plan(max_chars=400)
    reply = Reply(spec, source, create_encoder(spec.format), transport, transport, out, plan=plan)
    task = asyncio.create_task(reply.run())
    await until(lambda: transport.opened is not None and len(transport.opened.sent) == 2)
    stream = transport.opened
    assert stream is not None
    assert stream.sent == ["Hello there.", "How are"]
    stream.release(2)
    so_far: list[Event] = []
    while not so_far or not isinstance(so_far[-1], Flushed):
        event = await out.get()
        assert event is not None
        so_far.append(event)
    first = [e.name for e in so_far if not isinstance(e, TextDelta)]
    assert first[-3:] == ["audio_chunk", "audio_chunk", "flushed"]
    assert so_far[-1] == Flushed("f1")
    stream.release(1)
    source.end()
    await task
    rest = drain(out)
    names = [e.name for e in rest if not isinstance(e, TextDelta)]
    assert names == ["audio_chunk", "flushed", "audio_stream_end", "agent_end"]
    assert [e.flush_id for e in rest if isinstance(e, Flushed)] == [2]


async def test_flushes_left_when_the_text_ends_are_answered_before_its_end() -> None:
    """Batch mode synthesizes once all the text is in: every flush is answered after its
    audio, before `audio_stream_end`."""
    source = ClientTextSource()
    given: list[str | FlushMark] = ["Hello there.", FlushMark("a"), " Bye.", FlushMark("b")]
    for item in given:
        assert source.offer(item)
    source.end()
    transport = MemoryTransport()
    out: asyncio.Queue[Event | None] = asyncio.Queue()
    spec = ReplySpec("c1", Mode.BATCH, FORMATS["pcm"], None, 1.0)
    reply = Reply(spec, source, create_encoder(spec.format), transport, transport, out)
    await reply.run()
    names = [e.name for e in drain(out) if not isinstance(e, TextDelta)]
    assert names[-5:] == ["audio_chunk", "flushed", "flushed", "audio_stream_end", "agent_end"]
    assert transport.batch_calls == [("Hello there. Bye.", False)]
