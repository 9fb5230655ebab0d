"""What a listener heard before a barge-in (`gateway.reply.heard`), and word timings across a
reply's chunks (`FramedTTSStream`), pure."""

from __future__ import annotations

import asyncio

import pytest

from gateway.reply.heard import heard_text, heard_words
from gateway.transports.base import TimedWords
from gateway.transports.framed_stream import FramedTTSStream
from kokoro_contract import protocol
from kokoro_contract.protocol import WordTiming

TEXT = "Your order of $29.99 shipped, Dr. Lee said. It arrives Tuesday!"
WORDS = [  # milliseconds, as the gateway keeps them
    WordTiming("Your", 0, 180),
    WordTiming("order", 180, 420),
    WordTiming("of", 420, 500),
    WordTiming("$29.99", 500, 1900),  # the expansion's time, the text's spelling
    WordTiming("shipped", 1900, 2300),
    WordTiming("Dr.", 2500, 2800),
    WordTiming("Lee", 2800, 3000),
    WordTiming("said", 3000, 3300),
    WordTiming("It", 3700, 3800),
    WordTiming("arrives", 3800, 4200),
    WordTiming("Tuesday", 4200, 4800),
]


@pytest.mark.parametrize(
    ("played_ms", "heard"),
    [
        (0, ""),
        (179, ""),  # the first word cut in the middle: not heard
        (180, "Your"),  # a word that ends exactly there: heard
        (1899, "Your order of"),  # "$29.99" not finished
        (1900, "Your order of $29.99"),
        (2450, "Your order of $29.99 shipped"),  # in the pause after the comma
        (3350, "Your order of $29.99 shipped, Dr. Lee said"),
        (4800, "Your order of $29.99 shipped, Dr. Lee said. It arrives Tuesday"),
        (99_999, "Your order of $29.99 shipped, Dr. Lee said. It arrives Tuesday"),
    ],
)
def test_heard_text_ends_at_the_last_whole_word(played_ms: float, heard: str) -> None:
    assert heard_text(WORDS, TEXT, played_ms) == heard


def test_words_the_text_spells_otherwise_are_joined_as_timed() -> None:
    words = [WordTiming("ten", 0, 200), WordTiming("thirty", 200, 500)]
    assert heard_text(words, "Meet at 10:30.", 600) == "ten thirty"
    assert heard_words(words, 250) == words[:1]


def test_a_stream_places_each_requests_words_where_its_audio_starts() -> None:
    """Model-server times count from each request's first sample; the stream's count from the
    reply's, across the chunks before it."""
    sent: list[str] = []

    async def send(frame: str) -> None:
        sent.append(frame)

    stream = FramedTTSStream(send, None, 1.0, timestamps=True)

    async def run() -> list[object]:
        await stream.send("Hello there.")
        await stream.send("How are you?")
        rid0, rid1 = (protocol.decode_frame(f)["request_id"] for f in sent)  # type: ignore[index]
        frames: list[str | bytes] = [
            protocol.StartMsg(rid0).encode(),
            protocol.WordTimingsMsg(
                rid0, (WordTiming("Hello", 0.0, 0.4), WordTiming("there", 0.4, 0.9))
            ).encode(),
            b"\x00\x01" * 24_000,  # one second of PCM
            protocol.CompleteMsg(rid0, 48_000, 0.5).encode(),
            protocol.StartMsg(rid1).encode(),
            protocol.WordTimingsMsg(rid1, (WordTiming("How", 0.05, 0.3),)).encode(),
            b"\x00\x01" * 12_000,
            protocol.WordTimingsMsg(rid1, (WordTiming("you", 0.6, 0.9),)).encode(),  # segment 2
            b"\x00\x01" * 12_000,
            protocol.CompleteMsg(rid1, 48_000, 0.5).encode(),
        ]
        for frame in frames:
            await stream.received(frame)
        await stream.end_input()
        return [piece async for piece in stream.audio()]

    pieces = asyncio.run(run())
    assert all('"timestamps":true' in frame for frame in sent)
    words = [w for piece in pieces if isinstance(piece, TimedWords) for w in piece.words]
    assert words == [
        WordTiming("Hello", 0.0, 0.4),
        WordTiming("there", 0.4, 0.9),
        WordTiming("How", 1.05, 1.3),  # the second request starts after one second of audio
        WordTiming("you", 1.6, 1.9),  # its later segment counts from the same start
    ]
    kinds = [type(p).__name__ for p in pieces]
    assert kinds == ["TimedWords", "bytes", "TimedWords", "bytes", "TimedWords", "bytes"]
