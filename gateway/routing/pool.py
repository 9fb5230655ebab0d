"""Several model servers behind one gateway: each reply goes to the least-loaded one that is
up, and fails over to another when its server cannot be reached before any audio.

`--model-server-url` takes several URLs (comma-separated), and a host name that resolves to
several addresses (a Kubernetes headless Service) counts as several servers; names are resolved
again every `resolve_every_s`. Each server's load (`GET /load`) is fetched on demand, at most
every `load_ttl_s`, with a short timeout on a client of its own (a longer one, `first_probe_s`,
until the server has answered once); one that cannot be reached, or answers wrongly (an error
status, or a body that is no load report: `MalformedLoadReport`), is skipped for `down_for_s`
and tried again after; one that is only slow to answer keeps the load it gave within
`stale_load_s`. Voices are asked of any server that answers, no load needed.

A new reply that no server can take now, for a reason time clears (a reply in progress needs its
spare time, one is about to end), may wait up to `wait_s` for one that can, while its first audio
can still come within the budget: asked again whenever a reply's chunk completes or a reply ends,
and at least every `load_ttl_s`, in arrival order, at most `max_waiting` at once, and at most
`per_client` of one client's (`admit`): the spare time that frees goes to the clients in turn,
not all of it to the one that asked most.

A reply counts on its server by the synthesis it asks for, not by its existence: from admission
(its text is given, or its LLM answers at once: a reply about to start), unless it waits for
text its client sends (a WebSocket `speak` with no text) with nothing asked of the engine
(`PooledTransport.track`'s `waiting`): such a reply counts for nothing, however long it waits,
and counts again once its client's text gives it something to synthesize.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from gateway.errors import TTSError
from gateway.reply.chunk_plan import FIRST_SLACK_S
from gateway.retry import RetryBudget
from gateway.routing.admission import (
    RETRY_WHEN_FULL_S,
    Candidate,
    InProgress,
    LoadReport,
    Profile,
    Refusal,
    choose,
)
from gateway.transports.base import Completed, OnComplete, Piece, TTSStream
from gateway.transports.model_server import STALL_TIMEOUT_S, ModelServerTransport
from kokoro_contract.load import MalformedLoadReport


@dataclass
class Upstream:
    url: str
    transport: ModelServerTransport
    load: LoadReport | None = None
    fetched_at: float = -1e9
    down_until: float = -1e9
    # the replies this gateway runs on it now (admitted and not yet ended), as placed there
    placed: list[PooledTransport] = field(default_factory=list)
    answered: bool = False  # its /load answered once (until then a probe waits longer)

    @property
    def replies(self) -> int:
        """Replies this gateway runs on it now, asking or not."""
        return len(self.placed)

    @property
    def plans(self) -> list[InProgress]:
        """The playback plans of those."""
        return [p.plan for p in self.placed if p.plan is not None]

    @property
    def starting(self) -> int:
        """Replies admitted whose plan is not tracked yet (nothing sent)."""
        return sum(not p.tracked for p in self.placed)

    def asking(self) -> list[PooledTransport]:
        """The replies there that ask it for synthesis now, or are about to."""
        return [p for p in self.placed if p.asking]

    def spare(self, now: float) -> tuple[Profile, ...]:
        """The spare profile of each reply under way there with work left."""
        return tuple(
            profile
            for p in self.asking()
            if p.plan is not None
            and p.plan.started
            and (profile := tuple(p.plan.spare_profile(now)))
        )

    def starting_now(self) -> int:
        """Replies admitted there that ask but have sent nothing yet (tracked or not)."""
        return sum(
            not p.tracked or (p.plan is not None and not p.plan.started) for p in self.asking()
        )

    @property
    def up(self) -> bool:
        return time.monotonic() >= self.down_until


@dataclass
class ModelServerPool:
    urls: Sequence[str]
    client: httpx.AsyncClient  # for synthesis (POST /invocations) and voices
    probe: httpx.AsyncClient = field(
        default_factory=lambda: httpx.AsyncClient(timeout=httpx.Timeout(0.5))
    )
    load_ttl_s: float = 0.25
    stale_load_s: float = 5.0  # a load probe that times out reuses an answer this recent
    first_probe_s: float = 2.0  # a load probe of a server not heard from yet waits this
    down_for_s: float = 2.0
    resolve_every_s: float = 10.0
    tts_timeout_s: float | None = None  # a stream silent this long past due: tts_timeout
    stall_timeout_s: float | None = STALL_TIMEOUT_S  # a session's pong this late: tts_stalled
    ready_ttl_s: float = 1.0  # readiness answers are reused this long
    max_waiting: int = 16  # new replies waiting for a server with spare time, at most
    first_slack_s: float = FIRST_SLACK_S  # a starting reply's first chunk may wait this

    def __post_init__(self) -> None:
        self._upstreams: dict[str, Upstream] = {}
        self._resolved_at = -1e9
        self._lock = asyncio.Lock()
        self._ready: tuple[float, bool] = (-1e9, False)  # (when, answer)
        self._turn = asyncio.Lock()  # replies that wait are asked again in arrival order
        self._changed = asyncio.Event()  # set (and replaced) when a reply's plan moves on
        self.waiting = 0  # new replies waiting for a server with spare time now
        self._waiting_by: dict[str, int] = {}  # of those, each client's

    @property
    def upstreams(self) -> list[Upstream]:
        return list(self._upstreams.values())

    async def aclose(self) -> None:
        await self.probe.aclose()

    # --- discovery and load -----------------------------------------------------------------

    async def _resolve(self) -> None:
        now = time.monotonic()
        if self._upstreams and now - self._resolved_at < self.resolve_every_s:
            return
        self._resolved_at = now
        urls: list[str] = []
        for url in self.urls:
            urls += await expand(url)
        kept = {u: self._upstreams.get(u) for u in urls}
        self._upstreams = {
            u: up if up is not None else Upstream(u, self._transport(u)) for u, up in kept.items()
        }

    def _transport(self, url: str) -> ModelServerTransport:
        return ModelServerTransport(
            url, self.client, self.probe, self.tts_timeout_s, self.stall_timeout_s
        )

    async def _fetch(self, upstream: Upstream) -> None:
        now = time.monotonic()
        fresh = upstream.load is not None and now - upstream.fetched_at < self.load_ttl_s
        if not upstream.up or fresh:
            return
        # a server not heard from yet has no answer of before to fall back on, and its first
        # probe opens a connection: it is given longer, so a gateway just started does not
        # take a busy server for down (and refuse its first replies) over one slow answer
        timeout = httpx.USE_CLIENT_DEFAULT if upstream.answered else self.first_probe_s
        try:
            response = await self.probe.get(upstream.url + "/load", timeout=timeout)
            response.raise_for_status()
            upstream.load = LoadReport.decode(response.content)
            upstream.fetched_at = now
            upstream.answered = True
        except httpx.TimeoutException:
            # slow to answer, not gone: a server that answered a moment ago keeps its last
            # load (a busy machine can be slow for a moment); one that has not is down
            if upstream.load is None or now - upstream.fetched_at > self.stale_load_s:
                self.mark_down(upstream)
        except (httpx.HTTPError, MalformedLoadReport):
            self.mark_down(upstream)

    def mark_down(self, upstream: Upstream) -> None:
        upstream.load = None
        upstream.down_until = time.monotonic() + self.down_for_s

    def changed(self) -> None:
        """A reply's chunk completed or a reply ended: replies waiting to start look again."""
        self._changed.set()
        self._changed = asyncio.Event()

    async def admit(
        self,
        budget_s: float | None,
        wait_s: float = 0.0,
        retries: RetryBudget | None = None,
        client: str = "",
        per_client: int = 0,
    ) -> PooledTransport | Refusal:
        """A new reply's transport, its place reserved on the server that takes it (`pick`);
        when none can take it for a reason time clears, it waits up to `wait_s` for one that
        can, behind the replies already waiting, its budget shrinking by the time waited.
        `retries`: the reply's tries, which its failover follows; `client`: whose reply it is,
        of whom at most `per_client` replies wait at once (0: no limit): one more is refused
        at once."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        chosen = await self.pick(budget_s)
        if isinstance(chosen, Upstream) and not self.waiting:
            return self.transport_for(chosen, retries)
        if isinstance(chosen, Refusal) and not chosen.deferrable:
            return chosen
        if budget_s is None or wait_s <= 0 or self.waiting >= self.max_waiting:
            return chosen if isinstance(chosen, Refusal) else self.transport_for(chosen, retries)
        if per_client and self._waiting_by.get(client, 0) >= per_client:
            return Refusal(
                f"{per_client} of this client's replies already wait for spare time",
                RETRY_WHEN_FULL_S,
            )
        self.waiting += 1
        self._waiting_by[client] = self._waiting_by.get(client, 0) + 1
        try:
            async with asyncio.timeout_at(start + wait_s), self._turn:
                while True:
                    changed = self._changed
                    chosen = await self.pick(budget_s - (loop.time() - start))
                    if isinstance(chosen, Upstream):
                        return self.transport_for(chosen, retries)  # reserved before the next looks
                    if not chosen.deferrable:
                        return chosen
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(self.load_ttl_s):
                            await changed.wait()
        except TimeoutError:
            last = await self.pick(budget_s - (loop.time() - start))
            return last if isinstance(last, Refusal) else self.transport_for(last, retries)
        finally:
            self.waiting -= 1
            if self._waiting_by[client] <= 1:
                del self._waiting_by[client]
            else:
                self._waiting_by[client] -= 1

    async def pick(self, budget_s: float | None) -> Upstream | Refusal:
        """The server for a new reply now; `budget_s` None: no admission control (least
        loaded)."""
        async with self._lock:
            await self._resolve()
        upstreams = self.upstreams
        if not any(u.up for u in upstreams):  # all marked down: ask again, not refuse blind
            for upstream in upstreams:  # (one that is back takes replies at once)
                upstream.down_until = -1e9
        await asyncio.gather(*(self._fetch(u) for u in upstreams))
        now = asyncio.get_running_loop().time()  # the plans' clock
        candidates = [
            Candidate(
                u.url,
                u.load if u.up else None,
                len(u.asking()),
                u.spare(now),
                u.starting_now(),
                self.first_slack_s,
            )
            for u in upstreams
        ]
        chosen = choose(candidates, budget_s)
        return chosen if isinstance(chosen, Refusal) else self._upstreams[chosen.name]

    async def voices(self) -> dict[str, Any]:
        """The voices of the first server that answers, those not marked down first. Every
        server offers the same voices, so no load is asked: a picker's list never waits on a
        load probe, nor fails because one was slow."""
        async with self._lock:
            await self._resolve()
        failure = TTSError(
            "the model server is unreachable", detail=f"no address for {', '.join(self.urls)}"
        )
        for upstream in sorted(self.upstreams, key=lambda u: not u.up):
            try:
                return await upstream.transport.voices()
            except TTSError as exc:
                failure = exc
        raise failure

    def transport_for(self, first: Upstream, budget: RetryBudget | None = None) -> PooledTransport:
        return PooledTransport(self, first, budget)

    async def ready(self) -> bool:
        """Whether any model server answers `/ping`, on the probe client (never queued behind
        synthesis), asked at most every `ready_ttl_s` however often readiness is probed."""
        when, answer = self._ready
        if time.monotonic() - when < self.ready_ttl_s:
            return answer
        async with self._lock:
            await self._resolve()
        answers = await asyncio.gather(*(u.transport.ready() for u in self.upstreams))
        self._ready = (time.monotonic(), any(answers))
        return any(answers)


class PooledTransport:
    """One reply's place in the pool and its transport: its chosen server first, then the
    others that are up. The reply counts (one reply, its plan once tracked) on the server that
    serves it now: a failover moves it there."""

    def __init__(
        self, pool: ModelServerPool, first: Upstream, budget: RetryBudget | None = None
    ) -> None:
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

    def _may_fail_over(self, exc: TTSError) -> bool:
        return self.budget is None or self.budget.may_fail_over(exc)

    def _completed(self, on_complete: OnComplete | None) -> OnComplete:
        def completed(done: Completed) -> None:
            if on_complete is not None:
                on_complete(done)
            self.pool.changed()  # its spare time grew: a waiting reply may start

        return completed

    def _order(self) -> list[Upstream]:
        """Where to open the reply's stream: its server first (unless it wedged on this
        reply: a frozen server accepts connections it never answers), then the others up."""
        others = [u for u in self.pool.upstreams if u is not self.upstream and u.up]
        first = [] if self.upstream.url in self._wedged else [self.upstream]
        return [*first, *sorted(others, key=lambda u: u.load.first_audio_s if u.load else 9e9)]

    @contextlib.asynccontextmanager
    async def open(
        self,
        voice: str | None,
        speed: float,
        on_complete: OnComplete | None = None,
        timestamps: bool = False,
    ) -> AsyncIterator[TTSStream]:
        error: TTSError | None = None
        for upstream in self._order():
            try:
                opened = upstream.transport.open(
                    voice, speed, self._completed(on_complete), timestamps
                )
                stream = await opened.__aenter__()
            except TTSError as exc:  # unreachable before anything was sent: try another
                self.pool.mark_down(upstream)
                if not self._may_fail_over(exc):
                    raise
                error = exc
                continue
            self._move(upstream)
            try:
                yield stream
            except BaseException as exc:
                if _wedged(exc):  # route new replies, and this one's resumption, elsewhere
                    self.pool.mark_down(upstream)
                    self._wedged.add(upstream.url)
                if not await opened.__aexit__(type(exc), exc, exc.__traceback__):
                    raise
            else:
                await opened.__aexit__(None, None, None)
            return
        raise error or TTSError("no model server is reachable", retryable=True)

    async def synthesize(
        self, text: str, voice: str | None, speed: float, timestamps: bool = False
    ) -> AsyncGenerator[Piece]:
        error: TTSError | None = None
        for upstream in self._order():
            started = False  # this server has given something: it is the one now
            try:
                async with contextlib.aclosing(
                    upstream.transport.synthesize(text, voice, speed, timestamps)
                ) as pcm:
                    async for chunk in pcm:
                        if not started:
                            started = True
                            self._move(upstream)
                        yield chunk
                return
            except TTSError as exc:
                if started or not self._may_fail_over(exc):
                    raise  # audio went out: never retry silently
                self.pool.mark_down(upstream)
                error = exc
        raise error or TTSError("no model server is reachable", retryable=True)


WEDGED = frozenset({"tts_timeout", "tts_stalled"})


def _wedged(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return any(_wedged(e) for e in exc.exceptions)
    return isinstance(exc, TTSError) and exc.code in WEDGED


async def expand(url: str) -> list[str]:
    """`url`, or one URL per address when its host name resolves to several."""
    parts = urlsplit(url.rstrip("/"))
    host = parts.hostname or ""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return [url.rstrip("/")]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, parts.port, family=socket.AF_INET, type=socket.SOCK_STREAM
        )
    except OSError:
        return [url.rstrip("/")]  # not resolvable now: kept, and marked down when probed
    addresses = sorted({str(info[4][0]) for info in infos})
    if len(addresses) <= 1:
        return [url.rstrip("/")]
    return [
        urlunsplit(parts._replace(netloc=f"{a}:{parts.port}" if parts.port else a))
        for a in addresses
    ]
