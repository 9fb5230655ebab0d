"""What the gateway learns of each model server by asking it: its load (`GET /load`, through
its transport) and whether any answers `/ping` (readiness).

A server's load is asked on demand, at most every `load_ttl_s`, with a short timeout (a longer
one, `first_probe_s`, until the server has answered once). One that cannot be reached, or
answers wrongly, is down for `down_for_s` and asked again after; one that is only slow to
answer keeps the load it gave within `stale_load_s`, and is down once that load is older. When
every server is down they are all asked again at once rather than a reply refused blind (one
that is back takes replies at once). These rules are `Probed`'s, pure, on the caller's clock;
`refresh` and `mark_down` are the only places a server's probe state changes. Readiness is
asked at most every `ready_ttl_s` however often it is probed (`Readiness`)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from gateway.aio import Clock
from gateway.errors import TTSError
from gateway.routing.admission import LoadReport
from gateway.transports.model_server import LoadTimeout
from kokoro_contract import load as contract

NEVER = -1e9  # a time long before any clock reading: "not yet"


@dataclass(frozen=True)
class ProbeRules:
    """How often a server's load is asked, how long an answer serves, how long a failure
    keeps a server out."""

    load_ttl_s: float = 0.25  # an answer this recent is not asked again
    stale_load_s: float = 5.0  # a probe that times out reuses an answer this recent
    first_probe_s: float = 2.0  # a probe of a server not heard from yet waits this
    down_for_s: float = 2.0  # a server that failed a probe or a reply is skipped this long


@dataclass(frozen=True)
class Probed:
    """What the probes have learned of one server: its last load and when it was asked for,
    until when it is down, and whether it has ever answered."""

    load: LoadReport | None = None  # None: down, or not asked yet
    fetched_at: float = NEVER  # when the last answer was asked for
    down_until: float = NEVER
    answered: bool = False  # its /load answered once (until then a probe waits longer)

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def worth_asking(self, now: float, rules: ProbeRules) -> bool:
        """Whether to ask its load now: it is up, and its last answer is older than the
        rules' TTL (or there is none)."""
        fresh = self.load is not None and now - self.fetched_at < rules.load_ttl_s
        return self.up(now) and not fresh

    def wait_s(self, rules: ProbeRules) -> float | None:
        """How long a probe waits for its answer (None: the probe client's short timeout). A
        server not heard from yet has no answer of before to fall back on, and its first probe
        opens a connection: it is given longer, so a gateway just started does not take a
        busy server for down (and refuse its first replies) over one slow answer."""
        return None if self.answered else rules.first_probe_s

    def reported(self, load: LoadReport, asked_at: float) -> Probed:
        """It answered the probe asked at `asked_at` with `load`."""
        return dataclasses.replace(self, load=load, fetched_at=asked_at, answered=True)

    def down(self, now: float, rules: ProbeRules) -> Probed:
        """It failed (a probe, or a reply's stream): skipped for `down_for_s` from `now`, its
        load forgotten."""
        return dataclasses.replace(self, load=None, down_until=now + rules.down_for_s)

    def slow(self, asked_at: float, now: float, rules: ProbeRules) -> Probed:
        """The probe asked at `asked_at` timed out at `now`: slow to answer, not gone, if it
        answered within `stale_load_s` before (a busy machine can be slow for a moment), its
        load kept; else down."""
        if self.load is None or asked_at - self.fetched_at > rules.stale_load_s:
            return self.down(now, rules)
        return self

    def asked_again(self) -> Probed:
        """No longer down: to be asked at once."""
        return dataclasses.replace(self, down_until=NEVER)


def all_down(probed: Sequence[Probed], now: float) -> bool:
    """Whether no server is up (then all are asked again, not a reply refused blind)."""
    return not any(p.up(now) for p in probed)


class LoadReporter(Protocol):
    """A server's transport as the probes use it (`ModelServerTransport`)."""

    async def load(self, timeout_s: float | None = None) -> contract.LoadReport:
        """Its `/load` report; `LoadTimeout` when none comes in `timeout_s`, `TTSError` when
        it cannot be reached or answers wrongly."""
        ...

    async def ready(self) -> bool:
        """Whether it answers `/ping`."""
        ...


class Probing(Protocol):
    """A server as the probes see it: its transport, and what they learned of it."""

    @property
    def transport(self) -> LoadReporter: ...

    probed: Probed


async def refresh(servers: Sequence[Probing], rules: ProbeRules, clock: Clock) -> None:
    """Ask each server whose last load is out of date for it, all at once; when every one is
    down, all are asked again first."""
    if all_down([s.probed for s in servers], clock()):
        for server in servers:
            server.probed = server.probed.asked_again()
    await asyncio.gather(*(probe(s, rules, clock) for s in servers))


async def probe(server: Probing, rules: ProbeRules, clock: Clock) -> None:
    """Ask `server` its load if it is worth asking now, and keep what it says. The outcome
    is applied to what is known when it comes (a reply may have marked the server down while
    the probe waited)."""
    asked_at = clock()
    if not server.probed.worth_asking(asked_at, rules):
        return
    try:
        report = await server.transport.load(server.probed.wait_s(rules))
    except LoadTimeout:
        server.probed = server.probed.slow(asked_at, clock(), rules)
    except TTSError:
        server.probed = server.probed.down(clock(), rules)
    else:
        server.probed = server.probed.reported(LoadReport.of(report), asked_at)


def mark_down(server: Probing, rules: ProbeRules, clock: Clock) -> None:
    """`server` failed a reply before anything was said (or wedged on one): skipped by new
    replies for `down_for_s`."""
    server.probed = server.probed.down(clock(), rules)


@dataclass(frozen=True)
class Readiness:
    """The last readiness answer: whether any server answered `/ping`, and when it was
    asked."""

    asked_at: float = NEVER
    ready: bool = False

    def reusable(self, now: float, ttl_s: float) -> bool:
        """Whether it is recent enough to answer with, not asking again."""
        return now - self.asked_at < ttl_s


async def any_ready(servers: Sequence[Probing]) -> bool:
    """Whether any of `servers` answers `/ping` (asked of all at once)."""
    answers = await asyncio.gather(*(s.transport.ready() for s in servers))
    return any(answers)
