"""Where a reply runs: each model server with the replies placed there (`Upstream`), what
admission is told of each (`candidates`), and one reply's place and transport
(`PooledTransport`): reserved on its server from admission until it ends, and moved with the
reply when it fails over to another server before any audio.

A reply counts on its server by the synthesis it asks for, not by its existence: from admission
(its text is given, or its LLM answers at once: a reply about to start), unless it waits for
text its client sends (a WebSocket `speak` with no text) with nothing asked of the engine
(`PooledTransport.track`'s `waiting`): such a reply counts for nothing, however long it waits,
and counts again once its client's text gives it something to synthesize."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.aio import Clock
from gateway.errors import TTSError
from gateway.retry import RetryBudget
from gateway.routing.admission import Candidate, InProgress, LoadReport
from gateway.routing.probes import Probed
from gateway.transports.base import Piece
from gateway.transports.framed_stream import FrameCarrier, FramedSessions
from gateway.transports.model_server import ModelServerTransport
from kokoro_contract.asks import Ask
from kokoro_contract.protocol import TextOptions


@dataclass
class Upstream:
    """One model server: its URL and transport, what the probes learned of it, and the
    replies this gateway has placed there."""

    url: str
    transport: ModelServerTransport
    clock: Clock  # the pool's, which `up` reads
    probed: Probed = field(default_factory=Probed)  # changed by `probes` only
    # the replies this gateway runs on it now (admitted and not yet ended), as placed there
    placed: list[PooledTransport] = field(default_factory=list)

    @property
    def load(self) -> LoadReport | None:
        """Its last load report (None: down, or not asked yet)."""
        return self.probed.load

    @property
    def up(self) -> bool:
        """Whether it is not marked down now."""
        return self.probed.up(self.clock())

    @property
    def replies(self) -> int:
        """Replies this gateway runs on it now, asking or not."""
        return len(self.placed)

    @property
    def plans(self) -> list[InProgress]:
        """The playback plans of those."""
        return [p.plan for p in self.placed if p.plan is not None]

    def asking(self) -> list[PooledTransport]:
        """The replies there that ask it for synthesis now, or are about to."""
        return [p for p in self.placed if p.asking]

    def asks(self, now: float) -> tuple[Ask, ...]:
        """What those ask of it at `now` (the plans' clock)."""
        return tuple(p.ask(now) for p in self.asking())


def candidates(
    upstreams: Sequence[Upstream],
    now: float,
    first_slack_s: float,
    others: Mapping[str, Sequence[Ask]] | None = None,
) -> list[Candidate]:
    """What admission weighs of each server at `now` (the plans' clock): its load if it is
    up, what the replies placed there ask of it (this gateway's, and `others`: those of the
    other gateways of a fleet, by server URL), and the spare time a starting one has."""
    others = others or {}
    return [
        Candidate(
            u.url,
            u.load if u.probed.up(now) else None,
            (*u.asks(now), *others.get(u.url, ())),
            first_slack_s,
        )
        for u in upstreams
    ]


def failover_order(placed: Upstream, others: Sequence[Upstream], wedged: bool) -> list[Upstream]:
    """Where to open a reply's stream: the server it is placed on first (unless it wedged on
    this reply: a frozen server accepts connections it never answers), then the other servers
    that are up, soonest first audio first (those with no load last)."""
    up = [u for u in others if u is not placed and u.up]
    first = [] if wedged else [placed]
    return [*first, *sorted(up, key=lambda u: u.load.first_audio_s if u.load else 9e9)]


class Servers(Protocol):
    """The pool as a reply's place uses it."""

    @property
    def upstreams(self) -> list[Upstream]:
        """Every server known now."""
        ...

    def mark_down(self, upstream: Upstream) -> None:
        """`upstream` failed a reply: new replies skip it for a while."""
        ...

    def changed(self) -> None:
        """A reply's chunk completed or a reply ended: replies waiting to start look again."""
        ...


class PooledTransport(FramedSessions):
    """One reply's place in the pool and its transport: its chosen server first, then the
    others that are up. The reply counts (one reply, its plan once tracked) on the server that
    serves it now: a failover moves it there."""

    def __init__(self, pool: Servers, first: Upstream, budget: RetryBudget | None = None) -> None:
        self.pool = pool
        self.upstream = first  # where the reply is counted now
        self.budget = budget  # the reply's tries: no failover once something was said
        load = first.load
        # nothing else to do there when it took the reply: no reply of this gateway's asking
        # it for synthesis, and (as its last load report says) no engine call running or
        # waiting
        self.alone = not first.asking() and (load is None or load.busy == load.waiting == 0)
        # it speaks progressively (its load report prices a first window): a chunk's first
        # audio comes before its last
        self.progressive = load is not None and load.first_window_s is not None
        # starting (a typical reply's work ahead) until its plan is tracked
        self.tracked = False
        self.plan: InProgress | None = None
        self._waiting: Callable[[], bool] | None = None
        self._released = False
        self._wedged: set[str] = set()  # servers that stalled or timed out on this reply
        first.placed.append(self)  # reserved from admission on, until `release`

    @property
    def asking(self) -> bool:
        """Whether the reply asks its server for synthesis now, or is about to: from
        admission on, but not while it waits for its client's text with nothing asked
        (`track`'s `waiting`)."""
        return self._waiting is None or not self._waiting()

    def ask(self, now: float) -> Ask:
        """What it asks of its server at `now` (the plan's clock): starting until its plan is
        tracked and has sent something, then the spare time of each chunk still to come (none
        known for a reply without a plan)."""
        if not self.tracked or (self.plan is not None and not self.plan.started):
            return Ask()
        return Ask.under_way(self.plan.spare_profile(now) if self.plan is not None else ())

    def track(self, plan: InProgress | None, waiting: Callable[[], bool] | None = None) -> None:
        """The reply's playback plan (None: it has none): admission asks it how much spare
        time the reply has. `waiting`, for a reply whose client sends its text: whether it
        waits for that text now, with nothing asked of the engine (then it counts for
        nothing)."""
        self.tracked = True
        if not self._released:
            self.plan = plan
            self._waiting = waiting
        self.pool.changed()

    def release(self) -> None:
        """The reply has ended: its place on the server is free again."""
        if not self._released:
            self._released = True
            self.tracked = True
            self.upstream.placed.remove(self)
            self.pool.changed()

    def _move(self, to: Upstream) -> None:
        """The reply is served by `to` now: it counts there, and no longer where it was."""
        was = self.upstream
        if to is was or self._released:
            return
        was.placed.remove(self)
        to.placed.append(self)
        self.upstream = to
        self.pool.changed()

    def _fail_over(self, upstream: Upstream, exc: TTSError) -> bool:
        """`upstream` failed the reply before anything was said: it is marked down; whether
        another server may take over at once (the reply's budget says)."""
        self.pool.mark_down(upstream)
        return self.budget is None or self.budget.may_fail_over(exc)

    def _order(self) -> list[Upstream]:
        return failover_order(self.upstream, self.pool.upstreams, self.upstream.url in self._wedged)

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[FrameCarrier]:
        """A session on the reply's server, or the first of the others that opens one; the
        reply counts there from then on. A server that froze on the reply's session is marked
        down and not opened again for this reply; each chunk completed there lets the replies
        waiting for spare time look again."""
        error: TTSError | None = None
        for upstream in self._order():
            try:
                opened = upstream.transport.connect()
                carrier = await opened.__aenter__()
            except TTSError as exc:  # unreachable before anything was sent: try another
                if not self._fail_over(upstream, exc):
                    raise
                error = exc
                continue
            self._move(upstream)
            carrier.progressed = self.pool.changed  # its spare time grew
            try:
                yield carrier
            except BaseException as exc:
                if wedged(exc):  # route new replies, and this one's resumption, elsewhere
                    self.pool.mark_down(upstream)
                    self._wedged.add(upstream.url)
                if not await opened.__aexit__(type(exc), exc, exc.__traceback__):
                    raise
            else:
                await opened.__aexit__(None, None, None)
            return
        raise error or TTSError("no model server is reachable", retryable=True)

    async def synthesize(
        self,
        text: str,
        voice: str | None,
        speed: float,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncGenerator[Piece]:
        error: TTSError | None = None
        for upstream in self._order():
            started = False  # this server has given something: it is the one now
            try:
                async with contextlib.aclosing(
                    upstream.transport.synthesize(text, voice, speed, timestamps, options)
                ) as pcm:
                    async for chunk in pcm:
                        if not started:
                            started = True
                            self._move(upstream)
                        yield chunk
                return
            except TTSError as exc:
                if started or not self._fail_over(upstream, exc):
                    raise  # audio went out: never retry silently
                error = exc
        raise error or TTSError("no model server is reachable", retryable=True)


WEDGED = frozenset({"tts_timeout", "tts_stalled"})


def wedged(exc: BaseException) -> bool:
    """Whether `exc` says the server froze on the reply (a stream silent past due, a session
    whose pong never came), in a group or not."""
    if isinstance(exc, BaseExceptionGroup):
        return any(wedged(e) for e in exc.exceptions)
    return isinstance(exc, TTSError) and exc.code in WEDGED
