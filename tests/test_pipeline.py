"""The reply pipeline over in-memory transports: ordering and failure, without servers."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

from gateway.encoders import create_encoder
from gateway.events import AgentEnd, AudioChunk, ErrorEvent, Event, TextDelta
from gateway.params import Mode
from gateway.pipeline import Reply, ReplySpec
from gateway.transports.base import OnComplete
from kokoro_contract.formats import FORMATS

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
    ) -> AsyncIterator[MemoryStream]:
        yield self.stream

    async def synthesize(
        self, text: str, voice: str | None, speed: float, timestamps: bool = False
    ) -> AsyncGenerator[bytes]:
        self.batch_calls.append((text, self.source is not None and self.source.gate.is_set()))
        yield PCM_PER_CHUNK


def make_reply(
    mode: Mode, source: GatedSource, transport: MemoryTransport
) -> tuple[Reply, asyncio.Queue[Event | None]]:
    out: asyncio.Queue[Event | None] = asyncio.Queue()
    spec = ReplySpec("u1", mode, FORMATS["pcm"], None, 1.0)
    return Reply(spec, source, create_encoder(spec.format), transport, transport, out), out


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
