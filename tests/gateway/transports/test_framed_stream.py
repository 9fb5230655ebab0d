"""What `FramedTTSStream` tells a reply of each chunk it completes: its synthesis time as the
model server reports it, and its first audio from the same start, measured at this end. Pure:
literal frames in, a clock the test moves."""

from __future__ import annotations

import asyncio

from gateway.errors import TTSError
from gateway.transports.base import Completed, TimedWords
from gateway.transports.framed_stream import FramedTTSStream
from kokoro_contract import protocol

SECOND = b"\x00\x01" * 24_000  # one second of PCM


def test_each_chunk_reports_its_first_audio_beside_its_whole_synthesis() -> None:
    sent: list[str] = []
    done: list[Completed] = []
    # the stream reads its clock when a chunk's first audio arrives and when it completes
    readings = iter([10.3, 11.5, 12.2, 12.2])

    async def send(frame: str) -> None:
        sent.append(frame)

    stream = FramedTTSStream(send, None, 1.0, done.append, clock=lambda: next(readings))

    async def run() -> int:
        await stream.send("A progressive chunk. Its audio comes in windows.")
        await stream.send("A whole one.")
        rid0, rid1 = (protocol.decode_frame(f)["request_id"] for f in sent)  # type: ignore[index]
        frames: list[str | bytes] = [
            protocol.StartMsg(rid0).encode(),
            SECOND,  # its first window, at 10.3
            SECOND,
            SECOND,
            protocol.CompleteMsg(rid0, 3 * len(SECOND), 1.5).encode(),  # at 11.5
            protocol.StartMsg(rid1).encode(),
            SECOND,  # all of it at once, at the end (12.2)
            protocol.CompleteMsg(rid1, len(SECOND), 0.7).encode(),
        ]
        for frame in frames:
            await stream.received(frame)
        await stream.end_input()
        pieces = [piece async for piece in stream.audio()]
        return sum(len(p) for p in pieces if isinstance(p, bytes))

    assert asyncio.run(run()) == 4 * len(SECOND)
    first, whole = done
    assert (first.index, first.chars, first.audio_bytes, first.elapsed_s) == (0, 48, 144_000, 1.5)
    assert first.first_audio_s is not None
    assert abs(first.first_audio_s - 0.3) < 1e-9  # 1.5 s less the 1.2 s after its first audio
    assert first.first_audio_bytes == len(SECOND)  # its first window
    assert (whole.index, whole.elapsed_s, whole.first_audio_s) == (1, 0.7, 0.7)
    assert whole.first_audio_bytes == len(SECOND)  # all of it


def test_word_timings_are_on_the_streams_clock_from_where_their_request_starts() -> None:
    """A request's words are shifted by the audio before the request, not before its words: a
    progressive server may send a window that ends no word ahead of them."""
    sent: list[str] = []

    async def send(frame: str) -> None:
        sent.append(frame)

    stream = FramedTTSStream(send, None, 1.0, None)

    async def run() -> list[tuple[str, float, float]]:
        await stream.send("Hello there, my friend.")
        await stream.send("Your order shipped.")
        rid0, rid1 = (protocol.decode_frame(f)["request_id"] for f in sent)  # type: ignore[index]
        frames: list[str | bytes] = [
            protocol.StartMsg(rid0).encode(),
            protocol.WordTimingsMsg(rid0, (protocol.WordTiming("Hello", 0.1, 0.5),)).encode(),
            SECOND,
            protocol.CompleteMsg(rid0, len(SECOND), 0.5).encode(),
            protocol.StartMsg(rid1).encode(),
            SECOND,  # a first window that ends no word
            protocol.WordTimingsMsg(rid1, (protocol.WordTiming("Your", 0.05, 1.4),)).encode(),
            SECOND,
            protocol.CompleteMsg(rid1, 2 * len(SECOND), 0.9).encode(),
        ]
        for frame in frames:
            await stream.received(frame)
        await stream.end_input()
        return [
            (w.word, w.start, w.end)
            async for piece in stream.audio()
            if isinstance(piece, TimedWords)
            for w in piece.words
        ]

    assert asyncio.run(run()) == [("Hello", 0.1, 0.5), ("Your", 1.05, 2.4)]  # after 1 s, not 2


def test_a_chunk_sent_while_the_reply_waits_with_nothing_pending_has_a_due_time() -> None:
    """The reply waits for the next frame with nothing pending (its text is slow), then sends a
    chunk to a model server that has frozen: the wait is limited from then on, and the reply
    fails with `tts_timeout`, not waits forever."""

    async def send(frame: str) -> None:
        pass

    async def run() -> TTSError:
        stream = FramedTTSStream(send, None, 1.0, tts_timeout_s=0.01)

        async def first_piece() -> bytes | TimedWords:
            return await anext(aiter(stream.audio()))

        reading = asyncio.create_task(first_piece())
        await asyncio.sleep(0)  # one turn: the reader waits, nothing pending, no limit yet
        assert not reading.done()
        await stream.send("Hello there.", deadline_ms=0.0)
        try:  # (the outer limit only fails the test if the wait is never limited)
            await asyncio.wait_for(reading, 10)
        except TTSError as error:
            return error
        raise AssertionError("the stream gave a piece with nothing sent back")

    error = asyncio.run(run())
    assert (error.code, error.retryable) == ("tts_timeout", True)
