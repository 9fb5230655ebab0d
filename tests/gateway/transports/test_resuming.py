"""The one retry policy, and the TTS stream that resumes before first audio, over scripted
transports (the real edges are covered in tests/end_to_end/test_faults*.py)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from gateway.aio import cancel_and_wait
from gateway.errors import TTSError
from gateway.retry import RetryBudget, RetryPolicy, retrying
from gateway.transports.base import Completed, OnComplete, Piece
from gateway.transports.framed_stream import FrameCarrier, FramedTTSStream, open_stream
from gateway.transports.resuming import ResumingTransport
from kokoro_contract import protocol
from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.protocol import TextOptions, WordTiming

FAST = RetryPolicy(attempts=4, base_s=0.0, max_s=0.0)  # no waiting in unit tests


def test_delays_grow_with_full_jitter_under_the_cap() -> None:
    policy = RetryPolicy(attempts=6, base_s=0.1, max_s=0.5)
    rng = random.Random(7)
    for retry, cap in [(1, 0.1), (2, 0.2), (3, 0.4), (4, 0.5), (5, 0.5)]:
        delays = [policy.delay(retry, rng) for _ in range(200)]
        assert 0.0 <= min(delays) <= max(delays) <= cap
        assert max(delays) > cap * 0.8  # spread over the whole range: replies do not align


async def test_retrying_until_success_or_a_final_error() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TTSError("restarting", retryable=True)
        return "ok"

    retried: list[float] = []
    result = await retrying(flaky, FAST, on_retry=lambda _e, wait: retried.append(wait))
    assert (result, len(calls), len(retried)) == ("ok", 3, 2)

    async def final() -> str:
        calls.append(1)
        raise TTSError("bad voice", code="tts_unknown_voice", retryable=False)

    calls.clear()
    with pytest.raises(TTSError, match="bad voice"):
        await retrying(final, FAST)
    assert len(calls) == 1

    async def always() -> str:
        calls.append(1)
        raise TTSError("down", retryable=True)

    calls.clear()
    with pytest.raises(TTSError, match="down"):
        await retrying(always, FAST)
    assert len(calls) == 4  # attempts in all

    calls.clear()
    past = asyncio.get_running_loop().time()  # no time left for another try
    with pytest.raises(TTSError, match="down"):
        await retrying(always, FAST, deadline=past)
    assert len(calls) == 1


def test_every_tts_retry_is_the_budgets_one_decision() -> None:
    """`next_try`: before anything was said, a retry after its wait while tries last; after,
    a resume at once for a stream that can resume elsewhere, never for one that cannot."""
    budget = RetryBudget(RetryPolicy(attempts=3, base_s=0.0, max_s=0.0))
    lost = TTSError("session lost", retryable=True)
    assert budget.next_try(lost) == 0.0  # before audio: a retry, after its wait
    budget.started = True
    assert budget.next_try(lost) is None  # after audio, for a stream that cannot resume
    assert budget.next_try(lost, resumable=True) == 0.0  # for one that can: at once
    assert budget.next_try(lost, resumable=True) is None  # no tries left (3 in all)
    final = TTSError("unknown voice", code="tts_unknown_voice", retryable=False)
    assert RetryBudget(FAST).next_try(final) is None
    assert RetryBudget(FAST, started=True).next_try(final, resumable=True) is None


def test_a_retry_past_the_deadline_is_refused_on_the_budgets_own_clock() -> None:
    """The budget reads the clock it is given (the gate's: the loop's by default), never
    another: a wait that would end at or past the deadline is no retry, one before it is."""
    now = [100.0]
    budget = RetryBudget(
        RetryPolicy(attempts=5, base_s=0.5, max_s=0.5), deadline=101.0, clock=lambda: now[0]
    )
    lost = TTSError("session lost", retryable=True)
    wait = budget.retry_after(lost)
    assert wait is not None
    assert wait <= 0.5  # full jitter: 100 + wait < 101
    now[0] = 100.6  # 100.6 + up to 0.5 may reach the deadline: refused only when it does
    later = budget.retry_after(lost)
    assert later is None or 100.6 + later < 101.0
    now[0] = 101.0
    assert budget.retry_after(lost) is None  # no time left: whatever the jitter draws


# --- the resuming stream ------------------------------------------------------------------------


@dataclass
class Attempt:
    """What one opened stream does: fail before audio, after `audio_frames` frames, or never."""

    fail: TTSError | None = None
    audio_frames: int = 0  # frames sent back before failing (when `fail`)
    fail_on_send: bool = False
    frame_bytes: int = 0  # each chunk's audio (its text) in frames of this size (0: one frame)
    words: bool = False  # each chunk's word timings (its text, one word) before its audio
    sent: list[tuple[str, float | None]] = field(default_factory=list)
    ended: bool = False
    exited_with: type[BaseException] | None = None


class ScriptedSession:
    """One session of an attempt, as a model server would run it: its requests as they come,
    and for each its start, its word timings (when asked: its text, one word), its text as its
    audio (in frames of `frame_bytes`), then its completion; the attempt fails after
    `audio_frames` audio frames when it is to fail."""

    def __init__(self, attempt: Attempt) -> None:
        self.attempt = attempt
        self.carrier = FrameCarrier(self.send_frame)
        self.requests: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def send_frame(self, frame: str) -> None:
        message = orjson.loads(frame)
        if "type" in message:  # close or cancel, as the session ends
            return
        if self.attempt.fail_on_send:
            raise TTSError("session lost", retryable=True)
        self.attempt.sent.append((message["text"], message.get("deadline_ms")))
        await self.requests.put(message)

    async def run(self) -> None:
        carrier, attempt = self.carrier, self.attempt
        frames = 0
        while True:
            message = await self.requests.get()
            rid, text = message["request_id"], message["text"]
            await carrier.received(protocol.StartMsg(rid).encode())
            if attempt.words:
                word = WordTiming(text.strip(), 0.0, pcm_duration_s(len(text)))
                await carrier.received(protocol.WordTimingsMsg(rid, (word,)).encode())
            size = attempt.frame_bytes or len(text)
            for start in range(0, len(text), size):
                if attempt.fail is not None and frames >= attempt.audio_frames:
                    await carrier.failed(attempt.fail)
                    return
                frames += 1
                await carrier.received(text[start : start + size].encode())
            await carrier.received(protocol.CompleteMsg(rid, len(text), 0.0).encode())


class ScriptedTransport:
    def __init__(self, *attempts: Attempt, refuse_opens: int = 0) -> None:
        self.attempts = list(attempts)
        self.opened: list[Attempt] = []
        self.refuse_opens = refuse_opens

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[FrameCarrier]:
        if self.refuse_opens:
            self.refuse_opens -= 1
            raise TTSError("unreachable", retryable=True)
        attempt = self.attempts[len(self.opened)]
        self.opened.append(attempt)
        session = ScriptedSession(attempt)
        running = asyncio.create_task(session.run())
        try:
            yield session.carrier
            attempt.ended = True  # the input ended, and the session closed
        except BaseException as exc:
            attempt.exited_with = type(exc)
            raise
        finally:
            await cancel_and_wait(running)

    def open(
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AbstractAsyncContextManager[FramedTTSStream]:
        return open_stream(self.connect, voice, speed, on_complete, timestamps)

    async def synthesize(
        self,
        text: str,
        voice: str | None,
        speed: float,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncGenerator[bytes]:
        attempt = self.attempts[len(self.opened)]
        self.opened.append(attempt)
        if attempt.fail is not None and attempt.audio_frames == 0:
            raise attempt.fail
        yield text.encode()
        if attempt.fail is not None:
            raise attempt.fail


async def speak(
    transport: ScriptedTransport,
    chunks: list[str],
    deadline_s: float = 60,
    completed: list[int] | None = None,
    words: list[WordTiming] | None = None,
) -> bytes:
    """What a reply does with its TTS: send every chunk, then read all the audio (the indices
    of the chunks completed and the word timings into `completed` and `words`)."""
    retries: list[BaseException] = []
    deadline = asyncio.get_running_loop().time() + deadline_s
    budget = RetryBudget(FAST, deadline, lambda exc, _: retries.append(exc))
    resuming = ResumingTransport(transport, transport, budget)

    def on_complete(done: Completed) -> None:
        if completed is not None:
            completed.append(done.index)

    async def collect_all(pieces: AsyncIterator[Piece]) -> bytes:
        audio = b""
        async for piece in pieces:
            if isinstance(piece, bytes):
                audio += piece
            elif words is not None:
                words.extend(piece.words)
        return audio

    async with resuming.open(None, 1.0, on_complete) as tts:

        async def send_all() -> None:
            for chunk in chunks:
                await tts.send(chunk, 1000.0)
            await tts.end_input()

        async with asyncio.TaskGroup() as tg:
            tg.create_task(send_all())
            audio = tg.create_task(collect_all(tts.audio()))
    return audio.result()


async def collect(frames: AsyncIterator[Piece]) -> bytes:
    return b"".join([frame async for frame in frames if isinstance(frame, bytes)])


async def test_a_stream_lost_before_audio_is_opened_again_with_every_chunk() -> None:
    lost = Attempt(fail=TTSError("session lost", retryable=True))
    fine = Attempt()
    transport = ScriptedTransport(lost, fine, refuse_opens=1)  # the server restarting, too
    assert await speak(transport, ["One. ", "Two. ", "Three."]) == b"One. Two. Three."
    assert [text for text, _ in fine.sent] == ["One. ", "Two. ", "Three."]
    assert fine.ended
    assert lost.exited_with is TTSError  # the failed attempt was left as failed: cancelled
    assert all(ms is not None and ms <= 1000.0 for _, ms in fine.sent)  # what is left of each


async def test_a_send_that_fails_resumes_through_the_audio_side() -> None:
    broken = Attempt(fail_on_send=True, fail=TTSError("session lost", retryable=True))
    fine = Attempt()
    transport = ScriptedTransport(broken, fine)
    assert await speak(transport, ["Hello. ", "World."]) == b"Hello. World."
    assert [text for text, _ in fine.sent] == ["Hello. ", "World."]


async def test_after_the_first_audio_a_lost_stream_resumes_where_the_listener_is() -> None:
    """A frozen or lost server after "One. Tw" was heard: the next attempt is sent what was
    not completed ("Two. ", "Three."), and the "Tw" it says again is not given twice."""
    stalled = TTSError("stalled", code="tts_stalled", retryable=True)
    late = Attempt(fail=stalled, audio_frames=4, frame_bytes=2, words=True)  # "On" "e." " " "Tw"
    fine = Attempt(frame_bytes=2, words=True)
    transport = ScriptedTransport(late, fine)
    completed: list[int] = []
    words: list[WordTiming] = []
    audio = await speak(transport, ["One. ", "Two. ", "Three."], completed=completed, words=words)
    assert audio == b"One. Two. Three."  # no repeat, no hole
    assert [text for text, _ in fine.sent] == ["Two. ", "Three."]
    assert completed == [0, 1, 2]  # each chunk once, under its index in the reply
    assert [(w.word, round(w.start * 48_000)) for w in words] == [
        ("One.", 0),
        ("Two.", 5),  # given once, before the failure; on the reply's clock
        ("Three.", 10),  # the resumed stream's, shifted by what came before it
    ]
    assert late.exited_with is TTSError


async def test_a_stream_that_cannot_resume_ends_the_reply() -> None:
    lost = TTSError("session lost", retryable=True)
    always = [Attempt(fail=lost, audio_frames=1, frame_bytes=1) for _ in range(4)]
    transport = ScriptedTransport(*always)
    with pytest.raises(ExceptionGroup) as failed:
        await speak(transport, ["One. ", "Two."])
    assert failed.group_contains(TTSError, match="session lost")
    assert len(transport.opened) == 4  # FAST.attempts (each says "O" again, then fails)
    final = TTSError("model server: unknown voice", code="tts_unknown_voice", retryable=False)
    transport = ScriptedTransport(Attempt(fail=final, audio_frames=1), Attempt())
    with pytest.raises(ExceptionGroup):
        await speak(transport, ["One. ", "Two."])
    assert len(transport.opened) == 1  # not retryable: never resumed


async def test_final_errors_and_spent_budgets_are_not_retried() -> None:
    final = Attempt(fail=TTSError("unknown voice", code="tts_unknown_voice", retryable=False))
    transport = ScriptedTransport(final, Attempt())
    with pytest.raises(ExceptionGroup) as failed:
        await speak(transport, ["Hi."])
    assert failed.group_contains(TTSError, match="unknown voice")
    assert len(transport.opened) == 1
    lost = Attempt(fail=TTSError("session lost", retryable=True))
    transport = ScriptedTransport(lost, Attempt())
    with pytest.raises(ExceptionGroup):
        await speak(transport, ["Hi."], deadline_s=0)  # the first audio is already due
    assert len(transport.opened) == 1
    always = [Attempt(fail=TTSError("down", retryable=True)) for _ in range(4)]
    transport = ScriptedTransport(*always)
    with pytest.raises(ExceptionGroup):
        await speak(transport, ["Hi."])
    assert len(transport.opened) == 4  # FAST.attempts


async def test_a_batch_call_is_made_again_only_before_its_audio() -> None:
    transport = ScriptedTransport(Attempt(fail=TTSError("throttled", retryable=True)), Attempt())
    resuming = ResumingTransport(transport, transport, RetryBudget(FAST))
    assert await collect(resuming.synthesize("Hi.", None, 1.0)) == b"Hi."
    assert len(transport.opened) == 2
    late = Attempt(fail=TTSError("stream error", retryable=True), audio_frames=1)
    transport = ScriptedTransport(late, Attempt())
    resuming = ResumingTransport(transport, transport, RetryBudget(FAST))
    with pytest.raises(TTSError, match="stream error"):
        await collect(resuming.synthesize("Hi.", None, 1.0))
    assert len(transport.opened) == 1
