"""Several model servers behind one gateway: each reply goes to the least-loaded one that is
up, and fails over to another when its server cannot be reached before any audio.

The pool joins the parts, each of which does one job, and holds their settings:
`discovery` (`--model-server-url` takes several URLs, comma-separated, and a host name that
resolves to several addresses counts as several servers, resolved again every
`resolve_every_s`), `probes` (each server's load, asked through its transport at most every
`load_ttl_s`, kept within `stale_load_s` when a probe is slow, a server skipped for
`down_for_s` when it fails; readiness asked at most every `ready_ttl_s`), `admission` (which
server can take a new reply in time, pure), `waiting` (a new reply waits up to `wait_s` for
spare time, at most `max_waiting` at once) and `placement` (a reply's place, reserved from
admission until it ends, and its failover). Voices are asked of any server that answers, no
load needed.

Every time read here and in the parts is `clock`'s: the running loop's by default, the clock
the replies' plans and asyncio's timeouts read."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from gateway.aio import Clock, loop_time
from gateway.errors import TTSError
from gateway.reply.plan.config import FIRST_SLACK_S
from gateway.retry import RetryBudget
from gateway.routing import probes
from gateway.routing.admission import Refusal, choose
from gateway.routing.discovery import Discovery, expand
from gateway.routing.placement import PooledTransport, Upstream, candidates
from gateway.routing.probes import ProbeRules, Readiness
from gateway.routing.waiting import WaitingLine
from gateway.transports.model_server import STALL_TIMEOUT_S, ModelServerTransport
from kokoro_contract.asks import Ask

# what other modules and the tests import from here
__all__ = ["ModelServerPool", "PooledTransport", "Upstream", "expand"]


class OtherGateways(Protocol):
    """The other gateways of a fleet in front of the same model servers
    (`gateway.fleet.asks.FleetAsks`)."""

    async def others(self, urls: Sequence[str]) -> Mapping[str, tuple[Ask, ...]]:
        """What their replies ask of each server now, by URL."""
        ...

    def changed(self) -> None:
        """This gateway's asks changed (a reply placed, a chunk done, a reply ended)."""
        ...


@dataclass
class ModelServerPool:
    """The model servers one gateway sends replies to, and the settings of its parts."""

    urls: Sequence[str]
    client: httpx.AsyncClient  # for synthesis (POST /invocations) and voices
    # for the load and readiness probes, with short timeouts (each server's transport is
    # given it when the server is first found)
    probe: httpx.AsyncClient = field(
        default_factory=lambda: httpx.AsyncClient(timeout=httpx.Timeout(0.5))
    )
    # how often a server's load is asked, how long an answer serves, how long a failure keeps
    # a server out: `ProbeRules`, whose defaults these are
    load_ttl_s: float = ProbeRules.load_ttl_s
    stale_load_s: float = ProbeRules.stale_load_s
    first_probe_s: float = ProbeRules.first_probe_s
    down_for_s: float = ProbeRules.down_for_s
    resolve_every_s: float = 10.0
    tts_timeout_s: float | None = None  # a stream silent this long past due: tts_timeout
    stall_timeout_s: float | None = STALL_TIMEOUT_S  # a session's pong this late: tts_stalled
    ready_ttl_s: float = 1.0  # readiness answers are reused this long
    max_waiting: int = 16  # new replies waiting for a server with spare time, at most
    first_slack_s: float = FIRST_SLACK_S  # a starting reply's first chunk may wait this
    clock: Clock = loop_time  # every time read by the pool and its parts
    # a fleet's other gateways, whose replies admission counts beside this one's
    others: OtherGateways | None = None

    def __post_init__(self) -> None:
        self._discovery = Discovery(self.urls, self._upstream, self.clock)
        self._readiness = Readiness()
        self._line = WaitingLine(self.clock)

    def _upstream(self, url: str) -> Upstream:
        transport = ModelServerTransport(
            url, self.client, self.probe, self.tts_timeout_s, self.stall_timeout_s
        )
        return Upstream(url, transport, self.clock)

    def _rules(self) -> ProbeRules:
        """The probes' rules as the settings say now."""
        return ProbeRules(self.load_ttl_s, self.stale_load_s, self.first_probe_s, self.down_for_s)

    @property
    def upstreams(self) -> list[Upstream]:
        return self._discovery.found

    @property
    def waiting(self) -> int:
        """New replies waiting for a server with spare time now."""
        return self._line.count

    @property
    def _turn(self) -> asyncio.Lock:
        """Held by the waiting reply that is looking now (arrival order)."""
        return self._line.turn

    async def aclose(self) -> None:
        await self.probe.aclose()

    def mark_down(self, upstream: Upstream) -> None:
        probes.mark_down(upstream, self._rules(), self.clock)

    def changed(self) -> None:
        """A reply's chunk completed or a reply ended: replies waiting to start look again."""
        self._line.changed()
        if self.others is not None:
            self.others.changed()

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
        can (`WaitingLine.admit`). `retries`: the reply's tries, which its failover follows;
        `client`: whose reply it is, of whom at most `per_client` replies wait at once (0: no
        limit)."""
        return await self._line.admit(
            self.pick,
            lambda chosen: self.transport_for(chosen, retries),
            budget_s,
            wait_s,
            self.load_ttl_s,
            self.max_waiting,
            client,
            per_client,
        )

    async def pick(self, budget_s: float | None) -> Upstream | Refusal:
        """The server for a new reply now; `budget_s` None: no admission control (least
        loaded)."""
        await self._discovery.refresh(self.resolve_every_s)
        upstreams = self.upstreams
        await probes.refresh(upstreams, self._rules(), self.clock)
        others = {} if self.others is None else await self.others.others([u.url for u in upstreams])
        chosen = choose(candidates(upstreams, self.clock(), self.first_slack_s, others), budget_s)
        return chosen if isinstance(chosen, Refusal) else self._discovery[chosen.name]

    async def voices(self) -> dict[str, Any]:
        """The voices of the first server that answers, those not marked down first. Every
        server offers the same voices, so no load is asked: a picker's list never waits on a
        load probe, nor fails because one was slow."""
        await self._discovery.refresh(self.resolve_every_s)
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
        placed = PooledTransport(self, first, budget)
        if self.others is not None:
            self.others.changed()
        return placed

    def asks(self) -> dict[str, tuple[Ask, ...]]:
        """What this gateway's replies ask of each server now, by URL."""
        now = self.clock()
        return {u.url: u.asks(now) for u in self.upstreams}

    async def ready(self) -> bool:
        """Whether any model server answers `/ping`, on the probe client (never queued behind
        synthesis), asked at most every `ready_ttl_s` however often readiness is probed."""
        if self._readiness.reusable(self.clock(), self.ready_ttl_s):
            return self._readiness.ready
        await self._discovery.refresh(self.resolve_every_s)
        answer = await probes.any_ready(self.upstreams)
        self._readiness = Readiness(self.clock(), answer)
        return answer
