"""The gateway's side of a reply's model-server session (`gateway.transports.tts_session`),
sans I/O: literal frames and events in, actions and the record out. No sockets, no sleeps; the
clock is a list of readings the test gives."""

from __future__ import annotations

from collections.abc import Iterator

import orjson

from gateway.transports.base import Completed, TimedWords
from gateway.transports.tts_session import (
    Action,
    Complete,
    Deliver,
    Fail,
    SendRequest,
    TTSSession,
)
from kokoro_contract import protocol
from kokoro_contract.protocol import WordTiming

SECOND = b"\x00\x01" * 24_000  # one second of PCM


def readings(*times: float) -> Iterator[float]:
    return iter(times)


def session(*times: float, timestamps: bool = False) -> TTSSession:
    clock = readings(*times)
    return TTSSession("af_heart", 1.0, timestamps, clock=lambda: next(clock), prefix="r")


def requests(actions: list[Action]) -> list[dict[str, object]]:
    """The requests among `actions`, as the model server reads them."""
    return [orjson.loads(a.frame) for a in actions if isinstance(a, SendRequest)]


def delivered(actions: list[Action]) -> list[object]:
    return [a.piece for a in actions if isinstance(a, Deliver)]


def done(actions: list[Action]) -> list[Completed]:
    return [a.done for a in actions if isinstance(a, Complete)]


def start(rid: str) -> str:
    return protocol.StartMsg(rid).encode()


def complete(rid: str, audio_bytes: int, elapsed_s: float) -> str:
    return protocol.CompleteMsg(rid, audio_bytes, elapsed_s).encode()


def feed(tts: TTSSession, *frames: bytes | str) -> list[Action]:
    return [action for frame in frames for action in tts.received(frame)]


def test_each_chunk_sent_is_one_request_pending_under_its_index_until_complete() -> None:
    tts = session(10.3, 11.5)
    (first,) = requests(tts.send("Hello there.", 800.0, now=100.0))
    (second,) = requests(tts.send("How are you?", None, now=100.5))
    assert first == {
        "text": "Hello there.",
        "request_id": "r-0-0",
        "voice": "af_heart",
        "speed": 1.0,
        "deadline_ms": 800.0,
    }
    assert (second["request_id"], "deadline_ms" in second) == ("r-0-1", False)
    assert [c.index for c in tts.pending] == [0, 1]
    assert tts.due_at() == 100.5  # the second is due as soon as it is sent; the first at 100.8
    actions = feed(tts, start("r-0-0"), SECOND, SECOND, complete("r-0-0", 96_000, 1.5))
    assert delivered(actions) == [SECOND, SECOND]
    (completed,) = done(actions)
    # its first audio at 10.3, complete at 11.5: 1.5 s less the 1.2 s that came after it
    assert (completed.index, completed.chars, completed.audio_bytes) == (0, 12, 96_000)
    assert completed.first_audio_s is not None
    assert abs(completed.first_audio_s - 0.3) < 1e-9
    assert completed.first_audio_bytes == len(SECOND)
    assert [c.index for c in tts.pending] == [1]
    assert tts.completions == [completed]
    assert tts.delivered == 2 * len(SECOND)  # what the listener has
    tts.end_input()
    assert not tts.finished  # the second is still pending
    feed(tts, start("r-0-1"), complete("r-0-1", 0, 0.2))
    assert tts.finished


def test_a_completion_is_taken_once_and_only_for_a_request_pending_now() -> None:
    tts = session()
    tts.send("One.", None, now=0.0)
    tts.send("Two.", None, now=0.0)
    tts.send("Three.", None, now=0.0)
    assert feed(tts, complete("someone-else-0", 10, 0.1)) == []  # never sent here
    assert done(feed(tts, complete("r-0-0", 10, 0.1)))[0].index == 0
    assert feed(tts, complete("r-0-0", 10, 0.1)) == []  # told already
    tts.received(protocol.CancelledMsg("r-0-2").encode())
    assert feed(tts, complete("r-0-2", 10, 0.1)) == []  # dropped by the server
    # out of order: taken as it comes, under its own index
    assert [d.index for d in done(feed(tts, complete("r-0-1", 10, 0.1)))] == [1]
    tts.end_input()
    assert tts.finished  # complete, or dropped by the server


def test_a_resume_after_audio_sends_just_the_unfinished_chunks_from_the_listeners_place() -> None:
    """Once "One. " is complete and "Tw" of "Two. " heard, the session is lost: the next
    session is sent "Two. " and "Three." with what is left of their deadlines, and the "Tw" it
    says again is not given twice (even cut inside a frame)."""
    tts = session(*[0.0] * 7, timestamps=True)  # each first audio and completion
    tts.send("One. ", 1000.0, now=10.0)
    tts.send("Two. ", 1000.0, now=10.25)
    tts.send("Three.", None, now=10.5)
    words = protocol.WordTimingsMsg
    actions = feed(
        tts,
        start("r-0-0"),
        words("r-0-0", (WordTiming("One.", 0.0, 0.5),)).encode(),
        b"On",
        b"e. ",
        complete("r-0-0", 5, 0.1),
        start("r-0-1"),
        words("r-0-1", (WordTiming("Two.", 0.0, 0.5),)).encode(),
        b"Tw",
    )
    assert delivered(actions) == [
        TimedWords((WordTiming("One.", 0.0, 0.5),)),  # held for the first audio
        b"On",
        b"e. ",
        TimedWords((WordTiming("Two.", 5 / 48_000, 5 / 48_000 + 0.5),)),
        b"Tw",
    ]
    lost = protocol.ErrorMsg("overloaded", "busy", "r-0-1").encode()
    (fail,) = tts.received(lost)
    assert isinstance(fail, Fail)
    assert (fail.error.code, fail.error.retryable) == ("tts_overloaded", True)
    assert tts.send("Four.", None, now=10.7) == []  # no session now: it waits for the resume

    again = tts.resume(now=11.0)
    sent = requests(again)
    assert [(r["text"], r["request_id"]) for r in sent] == [
        ("Two. ", "r-1-1"),
        ("Three.", "r-1-2"),
        ("Four.", "r-1-3"),
    ]
    assert sent[0]["deadline_ms"] == 250.0  # sent at 10.25, due at 11.25: 250 ms are left
    assert "deadline_ms" not in sent[1]
    assert (tts.base, tts.base_bytes, tts.repeat_bytes) == (1, 5, 2)
    assert feed(tts, complete("r-0-1", 5, 0.1)) == []  # the lost session's: refused
    actions = feed(
        tts,
        start("r-1-1"),
        words("r-1-1", (WordTiming("Two.", 0.0, 0.5),)).encode(),  # had: dropped
        b"T",
        b"wo",  # "T" and "w" heard, "o" not
        b". ",
        complete("r-1-1", 5, 0.1),
        start("r-1-2"),
        words("r-1-2", (WordTiming("Three.", 0.0, 0.5),)).encode(),
        b"Three.",
        complete("r-1-2", 6, 0.1),
    )
    assert delivered(actions) == [
        b"o",
        b". ",
        TimedWords((WordTiming("Three.", 10 / 48_000, 10 / 48_000 + 0.5),)),  # on the reply's clock
        b"Three.",
    ]
    assert [d.index for d in done(actions)] == [1, 2]  # under their indices in the reply
    assert tts.delivered == len(b"One. Two. Three.")


def test_before_audio_a_resume_sends_everything_and_drops_the_timings_it_held() -> None:
    tts = session(timestamps=True)
    tts.send("Hello there.", 500.0, now=0.0)
    held = feed(
        tts,
        start("r-0-0"),
        protocol.WordTimingsMsg("r-0-0", (WordTiming("Hello", 0.0, 0.4),)).encode(),
    )
    assert held == []  # waiting for the first audio
    (fail,) = tts.stalled(2.0)
    assert isinstance(fail, Fail)
    assert (fail.error.code, fail.error.retryable) == ("tts_timeout", True)
    (sent,) = requests(tts.resume(now=0.3))
    assert (sent["request_id"], sent["deadline_ms"]) == ("r-1-0", 200.0)
    assert (tts.base, tts.base_bytes, tts.repeat_bytes) == (0, 0, 0)
    tts.end_input()
    assert tts.finish() == []  # the lost attempt's timings are gone, not given at the end


def test_timings_of_a_stream_with_no_audio_are_given_when_it_ends() -> None:
    tts = session(timestamps=True)
    tts.send("Hm.", None, now=0.0)
    feed(
        tts,
        start("r-0-0"),
        protocol.WordTimingsMsg("r-0-0", (WordTiming("Hm.", 0.0, 0.0),)).encode(),
        complete("r-0-0", 0, 0.05),
    )
    tts.end_input()
    assert tts.finished
    assert delivered(tts.finish()) == [TimedWords((WordTiming("Hm.", 0.0, 0.0),))]


def test_a_completion_with_no_audio_before_it_has_no_first_audio() -> None:
    tts = session()  # no clock reading at all
    tts.send("...", None, now=0.0)
    (completed,) = done(feed(tts, start("r-0-0"), complete("r-0-0", 0, 0.05)))
    assert (completed.first_audio_s, completed.first_audio_bytes) == (None, None)


def test_the_due_time_is_the_earliest_pending_chunks() -> None:
    tts = session()
    assert tts.due_at() is None  # nothing pending: no limit on the wait
    tts.send("One.", 2000.0, now=5.0)
    tts.send("Two.", 500.0, now=5.0)
    assert tts.due_at() == 5.5
    feed(tts, complete("r-0-1", 0, 0.1))
    assert tts.due_at() == 7.0
