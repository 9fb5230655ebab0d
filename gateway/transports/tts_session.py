"""One reply's session with the model server, sans I/O: literal events in, actions out, and the
one record of what the reply asked and what came back, across every attempt (the session
opened again after a failure). The adapter (`framed_stream.FramedTTSStream`) owns the I/O: it
feeds the events as they happen and carries out the actions; nothing else counts chunks,
completions, resume offsets or what the listener has.

Events in:

- `send(text, deadline_ms, now)`: the reply sends a chunk (chunk sent);
- `end_input()`: no more chunks;
- `received(frame)`: a model-server frame as its carrier read it, by the frame rule: PCM
  (`audio`), `synthesis_start` (`started`), `word_timings` (`words`), `synthesis_complete`
  (`completed`), `synthesis_cancelled` (`cancelled`), `error` (`failed`);
- `failed(error)`: the attempt cannot go on: its session lost, `tts_stalled` (the carrier's
  pings), a model-server error; `stalled(timeout_s)`: no frame for `timeout_s` past the
  earliest pending chunk's due time (`tts_timeout`);
- `resume(now)`: a new attempt's session is open (what the retry budget allowed);
- `finish()`: the attempt's frames are over (input ended, every chunk done).

Actions out: `SendRequest` (a chunk's request, a frame for the current session), `Deliver` (a
piece for the reply: PCM it has not had, word timings on its clock), `Complete` (a chunk's
completion, under its index in the reply, with its first-audio measurement), `Fail` (end the
attempt with this error).

The record: `chunks`, each chunk by its index in the reply (`SentChunk`: text, deadline, when
sent; its request id and due time on the current attempt; its first audio's time and bytes;
where its audio starts in the reply; its completion); `pending` (sent on the current attempt,
neither complete nor cancelled); `delivered` (PCM given to the reply: what the listener has);
the current attempt (`attempt`; `base`, its first chunk; `base_bytes`, where its audio starts
in the reply; `repeat_bytes`, of its audio what the listener has already: said again, not given
twice); `words_at` (where the last word timings given were). A resume sends every chunk not
complete, each with what is left of its deadline, from the first of them: its audio starts
where that chunk's starts in the reply, so nothing is given twice and nothing is missed (the
same text, voice and speed give the same audio). Word timings wait for the reply's first audio
(an attempt given up on before it leaves none behind); timings the reply had are not given
again.

A completion is taken once, for a chunk pending on the current attempt; one for a request this
session never sent, sent on an earlier attempt, cancelled, or complete already is refused
(nothing out). Completions out of order are taken as they come, under their own index (the
model server answers in order; a resume starts from the first chunk not complete whatever came
after it).

Times: `now` arguments are the loop's clock (a chunk's due time, what is left of its deadline:
the adapter's waits run on it); `clock`, given at construction, times each chunk's first audio
and is read only when that audio arrives and when the chunk completes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from gateway.aio import Clock
from gateway.errors import TTSError, model_server_error
from gateway.transports.base import Completed, Piece, TimedWords
from kokoro_contract import protocol
from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.protocol import (
    CancelledMsg,
    CompleteMsg,
    ErrorMsg,
    StartMsg,
    TextOptions,
    WordTiming,
    WordTimingsMsg,
)

RETRYABLE_CODES = frozenset({"not_ready", "overloaded"})  # a model server's, worth a retry


@dataclass(frozen=True)
class SendRequest:
    """Send this frame on the current attempt's session."""

    frame: str


@dataclass(frozen=True)
class Deliver:
    """Give the reply this piece: PCM it has not had, or word timings on its clock."""

    piece: Piece


@dataclass(frozen=True)
class Complete:
    """Chunk `done.index` of the reply is complete: tell the reply (its plan)."""

    done: Completed


@dataclass(frozen=True)
class Fail:
    """The attempt cannot go on: end it with `error` (the retry budget says what follows)."""

    error: TTSError


Action = SendRequest | Deliver | Complete | Fail


@dataclass
class SentChunk:
    """One chunk of the reply: what was asked, and what came of it."""

    index: int  # in the reply
    text: str
    deadline_ms: float | None  # when sent first: its first audio needed this long after
    sent_at: float  # loop time it was first sent
    request_id: str = ""  # on the current attempt ("": not sent on it)
    due_at: float = 0.0  # loop time its first audio is due on the current attempt
    start_bytes: int | None = None  # where its audio starts in the reply's PCM
    first_audio_at: float | None = None  # `clock` time of its first audio (current attempt)
    first_audio_bytes: int | None = None  # PCM in its first audio frame
    cancelled: bool = False  # the model server dropped it on the current attempt
    completion: Completed | None = None


class TTSSession:
    def __init__(
        self,
        voice: str | None,
        speed: float,
        timestamps: bool = False,
        clock: Clock | None = None,
        prefix: str | None = None,
        options: TextOptions | None = None,
    ) -> None:
        """`clock` times first audio (required once a chunk's audio arrives); `prefix`
        starts every request id (a random one by default); `options`: how every chunk's text
        is read (None: the model server's way)."""
        self.voice = voice
        self.speed = speed
        self.options = options
        self.timestamps = timestamps
        self.prefix = prefix or uuid.uuid4().hex[:12]
        self._clock = clock
        self.chunks: list[SentChunk] = []
        self.input_ended = False
        self.delivered = 0  # PCM given to the reply
        self.attempt = 0
        self.base = 0  # the current attempt's first chunk
        self.base_bytes = 0  # where its audio starts in the reply's PCM
        self.repeat_bytes = 0  # of its audio, what the listener has already
        self.attempt_bytes = 0  # PCM the current attempt has given, repeated or not
        self.words_at = -1  # PCM position of the last word timings given
        self.failure: TTSError | None = None  # why the current attempt cannot go on
        self._by_id: dict[str, SentChunk] = {}  # the current attempt's requests
        self._current: SentChunk | None = None  # whose audio comes now
        self._held: list[tuple[int, TimedWords]] = []  # timings waiting for the first audio

    # --- the record -------------------------------------------------------------------------

    @property
    def pending(self) -> list[SentChunk]:
        """Chunks sent on the current attempt, neither complete nor cancelled, in order."""
        return [c for c in self._by_id.values() if c.completion is None and not c.cancelled]

    @property
    def completions(self) -> list[Completed]:
        return [c.completion for c in self.chunks if c.completion is not None]

    @property
    def finished(self) -> bool:
        """No more chunks, and every one complete (or dropped by the model server)."""
        return self.input_ended and all(
            c.completion is not None or c.cancelled for c in self.chunks
        )

    def due_at(self) -> float | None:
        """When the earliest pending chunk's first audio is due (None: nothing pending)."""
        return min((c.due_at for c in self.pending), default=None)

    # --- events -----------------------------------------------------------------------------

    def send(self, text: str, deadline_ms: float | None, now: float) -> list[Action]:
        """The reply sends a chunk; after a failure it waits for the resume, which sends it."""
        chunk = SentChunk(len(self.chunks), text, deadline_ms, now)
        self.chunks.append(chunk)
        if self.failure is not None:
            return []
        return [self._request(chunk, deadline_ms, now)]

    def end_input(self) -> None:
        self.input_ended = True

    def received(self, frame: bytes | str) -> list[Action]:
        match protocol.read_server_frame(frame):
            case bytes() as pcm:
                return self.audio(pcm)
            case StartMsg(request_id=rid):
                self.started(rid)
            case WordTimingsMsg(request_id=rid, words=words):
                return self.words(rid, words)
            case CompleteMsg(request_id=rid, audio_bytes=audio_bytes, elapsed_s=elapsed_s):
                return self.completed(rid, audio_bytes, elapsed_s)
            case CancelledMsg(request_id=rid):
                self.cancelled(rid)
            case ErrorMsg(code=code, message=message):
                return self.failed(model_server_error(code, message, code in RETRYABLE_CODES))
            case _:
                pass  # control types this side does not know
        return []

    def started(self, request_id: str) -> None:
        """Its audio follows: it starts where the audio before it ended (not where its first
        words come: a progressive server may send a window that ends no word before them)."""
        chunk = self._by_id.get(request_id)
        if chunk is not None:
            self._current = chunk
            self._starts(chunk)

    def audio(self, pcm: bytes) -> list[Action]:
        chunk = self._current
        if chunk is not None and chunk.first_audio_at is None:
            chunk.first_audio_at = self._now()
            chunk.first_audio_bytes = len(pcm)
        before = self.attempt_bytes
        self.attempt_bytes += len(pcm)
        if self.attempt_bytes <= self.repeat_bytes:
            return []  # the listener has it: said again after a resume
        actions: list[Action] = []
        if not self.delivered:  # the first audio: the timings held for it go first
            for at, words in self._held:
                self.words_at = max(self.words_at, at)
                actions.append(Deliver(words))
            self._held.clear()
        piece = pcm[max(0, self.repeat_bytes - before) :]
        self.delivered += len(piece)
        actions.append(Deliver(piece))
        return actions

    def words(self, request_id: str, words: tuple[WordTiming, ...]) -> list[Action]:
        """Word timings, in seconds from the start of their request's audio, placed on the
        reply's clock; held until the reply's first audio, dropped when the reply had them."""
        at = self.base_bytes + self.attempt_bytes
        chunk = self._by_id.get(request_id)
        start = pcm_duration_s(at if chunk is None else self._starts(chunk))
        if at <= self.words_at:
            return []  # given before this attempt
        timed = TimedWords(tuple(WordTiming(w.word, start + w.start, start + w.end) for w in words))
        if not self.delivered:
            self._held.append((at, timed))
            return []
        self.words_at = at
        return [Deliver(timed)]

    def completed(self, request_id: str, audio_bytes: int, elapsed_s: float) -> list[Action]:
        """Its first audio took the server's elapsed time less what came after it here."""
        chunk = self._by_id.get(request_id)
        if chunk is None or chunk.completion is not None or chunk.cancelled:
            return []  # not pending on this attempt: refused
        first = None
        if chunk.first_audio_at is not None:
            first = min(elapsed_s, max(0.0, elapsed_s - (self._now() - chunk.first_audio_at)))
        chunk.completion = Completed(
            chunk.index, len(chunk.text), audio_bytes, elapsed_s, first, chunk.first_audio_bytes
        )
        return [Complete(chunk.completion)]

    def cancelled(self, request_id: str) -> None:
        chunk = self._by_id.get(request_id)
        if chunk is not None and chunk.completion is None:
            chunk.cancelled = True

    def failed(self, error: TTSError) -> list[Action]:
        """The attempt cannot go on; chunks sent from now wait for the resume."""
        if self.failure is None:
            self.failure = error
        return [Fail(error)]

    def stalled(self, timeout_s: float) -> list[Action]:
        """No frame came for `timeout_s` past the earliest pending chunk's due time."""
        return self.failed(
            TTSError(
                f"no audio from the model server for {timeout_s:.1f} s past its due time",
                code="tts_timeout",
                retryable=True,
            )
        )

    def resume(self, now: float) -> list[Action]:
        """A new attempt's session is open: it is sent every chunk not complete, each with
        what is left of its deadline, and its audio starts where the first of them starts in
        the reply; of that, what the listener has is not given again."""
        self.attempt += 1
        self.failure = None
        self._by_id.clear()
        self._current = None
        self._held.clear()
        unfinished = [c for c in self.chunks if c.completion is None]
        self.base = unfinished[0].index if unfinished else len(self.chunks)
        self.base_bytes = sum(
            c.completion.audio_bytes for c in self.chunks[: self.base] if c.completion is not None
        )
        self.repeat_bytes = max(0, self.delivered - self.base_bytes)
        self.attempt_bytes = 0
        actions: list[Action] = []
        for chunk in unfinished:
            left = chunk.deadline_ms
            if left is not None:
                left = max(0.0, left - (now - chunk.sent_at) * 1000)
            actions.append(self._request(chunk, left, now))
        return actions

    def finish(self) -> list[Action]:
        """The attempt's frames are over: timings held for audio that never came."""
        held, self._held = self._held, []
        return [Deliver(words) for _, words in held]

    # --- inside -----------------------------------------------------------------------------

    def _request(self, chunk: SentChunk, deadline_ms: float | None, now: float) -> SendRequest:
        rid = f"{self.prefix}-{self.attempt}-{chunk.index}"
        chunk.request_id = rid
        chunk.due_at = now + (deadline_ms or 0.0) / 1000
        chunk.start_bytes = chunk.first_audio_at = chunk.first_audio_bytes = None
        chunk.cancelled = False
        self._by_id[rid] = chunk
        return SendRequest(
            protocol.synthesize_message(
                chunk.text, rid, self.voice, self.speed, deadline_ms, self.timestamps, self.options
            )
        )

    def _starts(self, chunk: SentChunk) -> int:
        if chunk.start_bytes is None:
            chunk.start_bytes = self.base_bytes + self.attempt_bytes
        return chunk.start_bytes

    def _now(self) -> float:
        assert self._clock is not None, "a clock is needed to time first audio"
        return self._clock()
