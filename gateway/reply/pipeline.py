"""One reply: small processors joined by bounded queues, in bidi or batch mode.

    bidi:  text -> plan -> TTS stream -> playback -> encoder -> events
    batch: text (all of it) -> one synthesis call -> playback -> encoder -> events

`_read_text` puts the source's deltas in a queue (and emits `text_delta`); `_cut` feeds them to
the plan and sends each chunk the moment it is decided; `_receive` puts the TTS audio in a
queue; `_play` encodes it, holding the first of it until the plan starts playback. A plan is a
`plan.protocol.Plan`: the playback plan (`plan.playback_plan.ChunkPlan`) cuts chunks that grow
with the listener's buffer, gives each its deadline and says when the listener's playback
starts (its `Plan.playback`: the first audio is held until what follows it can be ready in
time); the `sentences` plan (`plan.sentence_plan.SentencePlan`, the chunker alone) sends every
sentence as it is final, with no deadline, and holds no playback. batch waits for all the text
and makes one call: the honest baseline. Both emit the same events, so measured differences are
timing alone.

Events go into a bounded queue that the route drains (through `gateway.service.speak`); when
the client goes away `speak` cancels the reply's task, which closes the source and the TTS
stream (the model server aborts its work) through their `async with`/`finally` blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gateway.aio import POKED, Inbox, first_leaf
from gateway.encoders import Encoder, EncoderError
from gateway.errors import GatewayError, LLMError
from gateway.params import Mode
from gateway.reply.events import (
    AgentEnd,
    AgentStart,
    AudioChunk,
    AudioStreamEnd,
    AudioStreamStart,
    ErrorEvent,
    Event,
    Flushed,
    TextDelta,
    Words,
)
from gateway.reply.flushes import FlushAcks, spoken_chars
from gateway.reply.heard import heard_text
from gateway.reply.plan.protocol import Plan
from gateway.reply.plan.sentence_plan import SentencePlan
from gateway.sources.base import FlushId, FlushMark, TextSource
from gateway.transports.base import (
    BatchTransport,
    BidiTransport,
    Completed,
    Piece,
    TimedWords,
    TTSStream,
)
from kokoro_contract import markup
from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.formats import AudioFormat
from kokoro_contract.protocol import TextOptions, WordTiming
from kokoro_contract.spoken import SpokenMeter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplySpec:
    utterance_id: str
    mode: Mode
    format: AudioFormat
    voice: str | None
    speed: float
    timestamps: bool = False  # word timings from the TTS (for heard_text)
    options: TextOptions | None = None  # how its text is read (language, normalisation)
    words_events: bool = False  # and `words` events before the audio they describe


@dataclass
class ReplyMetrics:
    started: float = field(default_factory=time.perf_counter)
    first_text_ms: float | None = None
    first_chunk_ms: float | None = None
    ttfa_ms: float | None = None
    text_chars: int = 0
    chunks_sent: int = 0
    audio_bytes: int = 0  # encoded bytes sent to the client
    pcm_bytes: int = 0
    chunk_times_ms: list[float] = field(default_factory=list)
    chunk_chars: list[int] = field(default_factory=list)  # each text chunk's characters
    chunk_audio_s: list[float] = field(default_factory=list)  # how long each chunk plays

    def since_start_ms(self) -> float:
        return round((time.perf_counter() - self.started) * 1000, 1)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ttfa_ms": self.ttfa_ms,
            "first_text_ms": self.first_text_ms,
            "first_chunk_ms": self.first_chunk_ms,
            "text_chars": self.text_chars,
            "chunks": self.chunks_sent,
            "chunk_times_ms": self.chunk_times_ms,
            "chunk_chars": self.chunk_chars,
            "chunk_audio_s": self.chunk_audio_s,
            "audio_bytes": self.audio_bytes,
            "duration_s": round(pcm_duration_s(self.pcm_bytes), 3),
            "total_ms": self.since_start_ms(),
        }


class _Signal(enum.Enum):
    END = "end"  # the text, or the model server's audio, ended


_T = TypeVar("_T")
# a chunk completed: the plan may go on sooner, which its processors learn from a poke of
# their inbox (never lost, never in an item's place), whatever the inbox holds
_Items = Inbox[_T | _Signal]
QUEUE_DELTAS = 1  # text waits for the plan: the source is read as fast as the plan takes it
QUEUE_PIECES = 8  # audio waits for the encoder and the client


class Reply:
    def __init__(
        self,
        spec: ReplySpec,
        source: TextSource,
        encoder: Encoder,
        bidi: BidiTransport,
        batch: BatchTransport,
        out: asyncio.Queue[Event | None],
        plan: Plan | None = None,
        max_s: float | None = None,
        text_stall_s: float | None = None,
        on_end: Callable[[], None] | None = None,
        max_audio_s: float | None = None,
        stop_reason: Callable[[], str | None] | None = None,
    ) -> None:
        """`plan` cuts the text (a `SentencePlan` when None). A reply still running after
        `max_s` seconds ends with `reply_too_long`, and so does one whose text would speak
        longer than `max_audio_s` (estimated, `kokoro_contract.spoken`): its text stops
        before the piece that crosses it, what came before is spoken. A source that sends
        nothing for `text_stall_s` (an LLM stalled mid-answer) ends it with `llm_timeout`.
        `on_end` is called once the reply is over and before `agent_end` is emitted, so what
        it settles (the client's quotas) is settled before the client can send its next
        request. `stop_reason`, for a source that says why its answer ended (Bedrock's
        messageStop), reads that reason for `agent_end`."""
        self.spec = spec
        self.source = source
        self.encoder = encoder
        self.bidi = bidi
        self.batch = batch
        self.out = out
        self.plan: Plan = plan if plan is not None else SentencePlan()
        self.metrics = ReplyMetrics()
        self._text_seq = 0
        self._audio_seq = 0
        self.error: ErrorEvent | None = None
        self.words: list[WordTiming] = []  # every word timed so far, in ms from the start
        self.spoken: list[str] = []  # the text as it came
        self.max_s = max_s
        self.max_audio_s = max_audio_s
        self._too_long = False  # the text stopped at `max_audio_s`
        self.text_stall_s = text_stall_s
        self.on_end = on_end
        self.stop_reason = stop_reason
        self._held: list[Piece] = []  # audio waiting for playback to start
        self._batch_asked = False  # batch: all the text came, its one call is asked
        # the processors' inboxes, poked when a chunk is done (sooner than estimated)
        self._wakes: list[Inbox[Any]] = []
        # the client's flushes (protocol 2), answered once the audio up to each has been sent:
        # counted in pieces of the TTS stream, as they came back and as they were given on
        self._flushes = FlushAcks()
        # an SSML reply's chunks, each made a document of its own; None until the first chunk
        # shows whether the reply is one (False: it is not)
        self._ssml: markup.SsmlFrames | bool | None = None
        self._received = 0
        self._emitted = 0
        self._pieces: Inbox[Any] | None = None  # `_play`'s inbox, poked when a flush comes

    def waiting_for_text(self) -> bool:
        """Whether the reply asks nothing of the engine and waits for its text: in batch mode
        until all of it has come, in bidi while its plan has nothing at the engine and
        nothing to send (`Plan.asking`)."""
        if self.spec.mode is Mode.BATCH:
            return not self._batch_asked
        return not self.plan.asking

    @property
    def held_bytes(self) -> int:
        """Audio ready but held until the plan starts playback."""
        return sum(len(p) for p in self._held if isinstance(p, bytes))

    async def run(self) -> None:
        """Emit the whole reply, ending with `agent_end` and None; errors become an `error`
        event before the end. Cancellation propagates (the route stops listening)."""
        spec = self.spec
        await self.out.put(AgentStart(spec.mode, spec.utterance_id))
        await self.out.put(
            AudioStreamStart(
                spec.format.name, spec.format.mime, spec.voice or "default", spec.format.codec_rate
            )
        )
        limit = asyncio.timeout(self.max_s)
        try:
            async with limit:
                if spec.mode is Mode.BIDI:
                    await self._bidi()
                else:
                    await self._batch()
            await self._emit_audio(self.encoder.flush())
            if not self._too_long:  # the audio is all sent: every flush is answered
                await self._answer(self._flushes.rest())
            if self._too_long:
                self.error = ErrorEvent(
                    "reply_too_long",
                    f"the reply's text would speak longer than {self.max_audio_s:.0f} s: it "
                    "stopped there",
                    status=400,
                )
        except* TimeoutError as group:
            if limit.expired():
                self.error = ErrorEvent(
                    "reply_too_long",
                    f"the reply ran past its limit of {self.max_s:.0f} s",
                    status=400,
                )
            else:  # not the reply's own limit: the edges raise their own errors, so a bug
                log.error("reply %s failed", spec.utterance_id, exc_info=group)
                self.error = ErrorEvent("internal_error", "the reply failed on the server")
        except* GatewayError as group:
            exc = first_leaf(group)
            assert isinstance(exc, GatewayError)
            if exc.detail:  # the upstream's address and answer: for the operator only
                log.warning("reply %s: %s", spec.utterance_id, exc.detail)
            self.error = ErrorEvent(exc.code, exc.message, exc.retryable, exc.status)
        except* EncoderError as group:
            self.error = ErrorEvent("encoder_error", str(first_leaf(group)))
        except* Exception as group:  # a bug: log it, tell the client no more than that
            log.error("reply %s failed", spec.utterance_id, exc_info=group)
            self.error = ErrorEvent("internal_error", "the reply failed on the server")
        await self.out.put(
            AudioStreamEnd(self._audio_seq, round(pcm_duration_s(self.metrics.pcm_bytes), 3))
        )
        if self.error is not None:
            await self.out.put(self.error)
        stop_reason = None if self.stop_reason is None else self.stop_reason()
        if self.on_end is not None:
            self.on_end()
        await self.out.put(AgentEnd(self.metrics.as_dict(), stop_reason))
        await self.out.put(None)

    def heard(self, played_ms: float) -> str:
        """What the listener heard of this reply, having played `played_ms` of it."""
        return heard_text(self.words, "".join(self.spoken), played_ms)

    # --- the modes: which processors run ---------------------------------------------------

    async def _bidi(self) -> None:
        spec = self.spec
        async with self.bidi.open(
            spec.voice, spec.speed, self._completed, spec.timestamps, spec.options
        ) as tts:
            deltas: _Items[str | FlushMark] = self._queue(QUEUE_DELTAS)
            pieces: _Items[Piece] = self._queue(QUEUE_PIECES)
            self._pieces = pieces
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._read_text(deltas))
                tg.create_task(self._cut(deltas, tts))
                tg.create_task(self._receive(tts.audio(), pieces))
                tg.create_task(self._play(pieces, hold=True))

    async def _batch(self) -> None:
        texts: list[str] = []
        async with aclosing(self._text()) as deltas:
            async for delta in deltas:
                if isinstance(delta, FlushMark):
                    self._flushes.flush(delta.flush_id)  # answered at the end, as it all is
                else:
                    texts.append(delta)
        text = "".join(texts)
        if not text.strip():
            return
        self._batch_asked = True
        self._chunk_released(len(text))
        spec = self.spec
        pieces: _Items[Piece] = self._queue(QUEUE_PIECES)
        synthesis = self.batch.synthesize(
            text, spec.voice, spec.speed, spec.timestamps, spec.options
        )
        async with aclosing(synthesis) as audio, asyncio.TaskGroup() as tg:
            tg.create_task(self._receive(audio, pieces))
            tg.create_task(self._play(pieces, hold=False))
        self.metrics.chunk_audio_s.append(round(pcm_duration_s(self.metrics.pcm_bytes), 3))

    def _queue(self, size: int) -> Inbox[Any]:
        inbox: Inbox[Any] = Inbox(size)
        self._wakes.append(inbox)
        return inbox

    # --- text -> plan -> TTS ---------------------------------------------------------------

    async def _deltas(self) -> AsyncGenerator[str | FlushMark]:
        """The source's text (and the client's flushes), failing with `llm_timeout` when it
        stalls."""
        async with aclosing(self.source.stream()) as stream:
            while True:
                try:
                    async with asyncio.timeout(self.text_stall_s):
                        delta = await anext(stream)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise LLMError(
                        f"the LLM sent nothing for {self.text_stall_s:.0f} s",
                        code="llm_timeout",
                        retryable=True,
                    ) from None
                yield delta

    async def _text(self) -> AsyncGenerator[str | FlushMark]:
        meter = SpokenMeter(self.spec.speed)
        async with aclosing(self._deltas()) as stream:
            async for delta in stream:
                if isinstance(delta, FlushMark):
                    yield delta
                    continue
                if not delta:
                    continue
                if self.max_audio_s and meter.push(delta) > self.max_audio_s:
                    self._too_long = True  # the source is closed; what came before is spoken
                    return
                if self.metrics.first_text_ms is None:
                    self.metrics.first_text_ms = self.metrics.since_start_ms()
                self.metrics.text_chars += len(delta)
                self.spoken.append(delta)
                await self.out.put(TextDelta(self._text_seq, delta))
                self._text_seq += 1
                yield delta

    async def _read_text(self, deltas: _Items[str | FlushMark]) -> None:
        async with aclosing(self._text()) as text:
            async for delta in text:
                await deltas.put(delta)
        await deltas.put(_Signal.END)

    async def _cut(self, deltas: _Items[str | FlushMark], tts: TTSStream) -> None:
        """Feed the text to the plan and send each chunk the moment it decides one; wake when
        the plan asks (`wake_at`) or a chunk completes, even with no new text. A client's
        flush makes the text so far final (`Plan.cut`); `_play` answers it."""
        plan = self.plan
        loop = asyncio.get_running_loop()
        ended = False
        while not ended or plan.unsent:
            wake = plan.wake_at()
            timeout = None if wake is None else max(0.0, wake - loop.time())
            try:
                async with asyncio.timeout(timeout):
                    delta = await deltas.get()
            except TimeoutError:
                delta = POKED
            if delta is POKED:  # its time, or a chunk done sooner
                chunks = plan.tick(loop.time())
            elif delta is _Signal.END:
                ended = True
                chunks = plan.flush(loop.time())
            elif isinstance(delta, FlushMark):
                self._flushes.flush(delta.flush_id)
                chunks = plan.cut(loop.time())
            else:
                self._flushes.text(spoken_chars(delta))
                chunks = plan.push(delta, loop.time())
            for chunk in chunks:
                self._chunk_released(len(chunk.text))
                self._flushes.sent(spoken_chars(chunk.text))
                await tts.send(self._framed(chunk.text), chunk.deadline_ms)
            if isinstance(delta, FlushMark) and self._pieces is not None:
                self._pieces.poke()  # a flush with nothing left to wait for is answered now
        await tts.end_input()

    def _framed(self, text: str) -> str:
        """A chunk as the model server is sent it: an SSML reply's as a document of its own
        (`markup.SsmlFrames`), any other as it is."""
        if self._ssml is None:
            mode = self.spec.options.markup if self.spec.options else "auto"
            ssml = mode != "none" and markup.is_ssml(text)
            self._ssml = markup.SsmlFrames() if ssml else False
        frames = self._ssml
        return frames.frame(text) if isinstance(frames, markup.SsmlFrames) else text

    def _chunk_released(self, chars: int) -> None:
        self.metrics.chunks_sent += 1
        at = self.metrics.since_start_ms()
        self.metrics.chunk_times_ms.append(at)
        self.metrics.chunk_chars.append(chars)
        if self.metrics.first_chunk_ms is None:
            self.metrics.first_chunk_ms = at

    def _completed(self, done: Completed) -> None:
        """The model server finished a chunk (the TTS stream tells each completion once, under
        its index in the reply, the moment its session core takes it): the plan learns how long
        it plays, took, and took to its first audio, and the processors waiting on it look
        again (the next chunk, or a held first audio, may go now): their inboxes are poked,
        which neither waits nor is lost, however full they are."""
        audio_s = pcm_duration_s(done.audio_bytes)
        self.metrics.chunk_audio_s.append(round(audio_s, 3))
        # its audio is all among the pieces received: the stream tells a completion after it
        self._flushes.completed(done.index, self._received)
        now = asyncio.get_running_loop().time()
        early = None if done.first_audio_bytes is None else pcm_duration_s(done.first_audio_bytes)
        self.plan.completed(done.index, audio_s, now, done.elapsed_s, done.first_audio_s, early)
        for inbox in self._wakes:
            inbox.poke()

    # --- TTS -> playback -> encoder -> events ----------------------------------------------

    async def _receive(self, audio: AsyncIterator[Piece], pieces: _Items[Piece]) -> None:
        async for piece in audio:
            await pieces.put(piece)
            self._received += 1
        await pieces.put(_Signal.END)

    async def _play(self, pieces: _Items[Piece], hold: bool) -> None:
        """Encode the audio as it comes; with `hold`, the first of it waits until the plan
        starts playback (`release_at`): then what follows it is ready in time. A reply that
        fails or is stopped still gives the audio it had (room permitting)."""
        try:
            await self._play_held(pieces, hold)
        except asyncio.CancelledError:  # a sibling failed (the stream broke) or the reply stops
            self._release_now()
            raise

    async def _play_held(self, pieces: _Items[Piece], hold: bool) -> None:
        playback = self.plan.playback  # None: the plan never holds playback
        held = self._held
        loop = asyncio.get_running_loop()
        while True:
            timeout = None
            if held:
                at = None if playback is None else playback.release_at(loop.time())
                if at is None or loop.time() >= at:
                    self._audio_started()
                    while held:  # one by one: what a cancel leaves is `_release_now`'s
                        await self._encode_one(held.pop(0))
                else:
                    timeout = at - loop.time()
            try:
                async with asyncio.timeout(timeout):
                    item = await pieces.get()
            except TimeoutError:
                continue
            if item is _Signal.END:
                break
            if item is POKED:  # a chunk completed, or a flush came: look again
                if not held:
                    await self._answer(self._flushes.due(self._emitted))
                continue
            if isinstance(item, bytes) and playback is not None:
                playback.audio_ready(loop.time())
            if held or (
                hold and playback is not None and playback.release_at(loop.time()) is not None
            ):
                held.append(item)
            else:
                await self._encode_one(item)
        self._audio_started()  # a reply that ends while held: all of it, now
        while held:
            await self._encode_one(held.pop(0))

    def _audio_started(self) -> None:
        """The reply's first audio goes to the listener: its plan's playback starts."""
        if (playback := self.plan.playback) is not None:
            playback.audio_started(asyncio.get_running_loop().time())

    def _release_now(self) -> None:
        for piece in self._held:
            for event in self._events_for(piece):
                with contextlib.suppress(asyncio.QueueFull):
                    self.out.put_nowait(event)
        self._held.clear()

    async def _encode_one(self, piece: Piece) -> None:
        for event in self._events_for(piece):
            await self.out.put(event)
        self._emitted += 1
        if self._flushes.waiting:
            await self._answer(self._flushes.due(self._emitted))

    async def _answer(self, flushes: list[FlushId | None]) -> None:
        """`flushed` for each flush named by the client (one with no id is answered by
        nothing). After the audio before it: for a codec, as far as the encoder has given it
        (the part of a frame it holds follows with the next audio)."""
        for flush_id in flushes:
            if flush_id is not None:
                await self.out.put(Flushed(flush_id))

    def _events_for(self, piece: Piece) -> list[Event]:
        """What one piece of the model server's output becomes for the client."""
        if isinstance(piece, TimedWords):  # seconds from the first sample: to milliseconds
            words = tuple(WordTiming(w.word, w.start * 1000, w.end * 1000) for w in piece.words)
            self.words += words
            return [Words(words)] if self.spec.words_events else []
        if not self.metrics.pcm_bytes:
            self._audio_started()
        self.metrics.pcm_bytes += len(piece)
        event = self._audio_event(self.encoder.push(piece))
        return [] if event is None else [event]

    async def _emit_audio(self, units: list[bytes]) -> None:
        event = self._audio_event(units)
        if event is not None:
            await self.out.put(event)

    def _audio_event(self, units: list[bytes]) -> AudioChunk | None:
        """One event per encoder call: the whole units it produced (MP3 frames, fMP4
        fragments, WebM clusters), joined, so no event splits a unit and none is tiny."""
        data = b"".join(units)
        if not data:
            return None
        if self.metrics.ttfa_ms is None:
            self.metrics.ttfa_ms = self.metrics.since_start_ms()
        self.metrics.audio_bytes += len(data)
        self._audio_seq += 1
        return AudioChunk(self._audio_seq - 1, data)
