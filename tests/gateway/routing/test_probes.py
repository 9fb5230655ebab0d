"""The probes' rules (`gateway.routing.probes`) on a clock the test turns: when a server's load
is asked, how long an answer serves, when a slow answer or a failure takes it down and for how
long. First the pure state (`Probed`) with literal times, then `refresh` over scripted
transports, then the pool itself with its probe client's answers scripted (no sockets). No
sleeps: time moves only when the test moves it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import httpx
import orjson

from gateway.errors import TTSError
from gateway.routing import pool, probes
from gateway.routing.admission import LoadReport, Refusal
from gateway.routing.probes import NEVER, Probed, ProbeRules, Readiness
from gateway.transports.model_server import LoadTimeout
from kokoro_contract import load as contract

RULES = ProbeRules(load_ttl_s=0.25, stale_load_s=5.0, first_probe_s=2.0, down_for_s=2.0)
IDLE = LoadReport(2, 0, 0, 0.0, None, 0.35, 0.028)  # two workers, nothing running


class Clock:
    """A clock that moves only when told."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


# --- the rules, pure ----------------------------------------------------------------------------


def test_a_server_never_asked_is_up_and_asked_with_the_longer_wait() -> None:
    new = Probed()
    assert (new.load, new.fetched_at, new.down_until, new.answered) == (None, NEVER, NEVER, False)
    assert new.up(0.0)
    assert new.worth_asking(0.0, RULES)
    assert new.wait_s(RULES) == 2.0  # first_probe_s: its first probe opens a connection
    assert new.reported(IDLE, 10.0).wait_s(RULES) is None  # then the probe client's own


def test_an_answer_serves_for_the_ttl_then_is_asked_again() -> None:
    answered = Probed().reported(IDLE, asked_at=10.0)
    assert (answered.load, answered.fetched_at, answered.answered) == (IDLE, 10.0, True)
    assert not answered.worth_asking(10.0, RULES)
    assert not answered.worth_asking(10.24, RULES)
    assert answered.worth_asking(10.25, RULES)


def test_a_slow_answer_keeps_a_recent_load_and_an_old_one_is_down() -> None:
    answered = Probed().reported(IDLE, asked_at=10.0)
    # asked 5 s after its last answer (stale_load_s), timed out 0.5 s later: kept as it was
    assert answered.slow(asked_at=15.0, now=15.5, rules=RULES) is answered
    # asked later than that: down from when the timeout came, its load forgotten
    gone = answered.slow(asked_at=15.25, now=15.75, rules=RULES)
    assert (gone.load, gone.down_until, gone.fetched_at) == (None, 17.75, 10.0)
    # never answered: a timeout is down at once
    assert Probed().slow(asked_at=1.0, now=3.0, rules=RULES).down_until == 5.0


def test_a_server_down_is_skipped_for_down_for_s_then_asked_again() -> None:
    down = Probed().reported(IDLE, 10.0).down(now=11.0, rules=RULES)
    assert down.load is None
    assert down.answered  # it did answer once: its next probe waits the short time
    assert not down.up(12.99)
    assert not down.worth_asking(12.99, RULES)
    assert down.up(13.0)
    assert down.worth_asking(13.0, RULES)
    assert down.asked_again().up(11.0)  # every server down: all asked again at once


def test_an_answer_that_comes_after_a_failure_leaves_the_server_down() -> None:
    """A reply marked the server down while its probe waited: the answer is kept, and the
    server stays down until `down_for_s` has passed."""
    down = Probed().down(now=10.0, rules=RULES)
    late = down.reported(IDLE, asked_at=9.5)
    assert (late.load, late.down_until) == (IDLE, 12.0)
    assert not late.up(11.0)


def test_all_down_is_no_server_up_now() -> None:
    up, down = Probed(), Probed().down(now=10.0, rules=RULES)
    assert probes.all_down([down, down], 11.0)
    assert not probes.all_down([down, up], 11.0)
    assert not probes.all_down([down], 12.0)  # its time is up
    assert probes.all_down([], 0.0)


def test_readiness_is_reused_for_its_ttl() -> None:
    asked = Readiness(asked_at=10.0, ready=True)
    assert asked.reusable(10.99, ttl_s=1.0)
    assert not asked.reusable(11.0, ttl_s=1.0)
    assert not Readiness().reusable(0.0, ttl_s=1.0)


# --- refresh over scripted transports -------------------------------------------------------------


class ScriptedTransport:
    """A server's transport whose `/load` answers are scripted: a report, or an error raised;
    each call's timeout recorded, and the clock moved by `takes_s` while it is asked."""

    def __init__(self, clock: Clock, *answers: contract.LoadReport | Exception) -> None:
        self.clock = clock
        self.answers = list(answers)
        self.waited: list[float | None] = []
        self.takes_s = 0.0
        self.during: list[Callable[[], None]] = []  # called while the probe waits

    async def load(self, timeout_s: float | None = None) -> contract.LoadReport:
        self.waited.append(timeout_s)
        self.clock.now += self.takes_s
        for call in self.during:
            call()
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def ready(self) -> bool:
        return True


class Server:
    def __init__(self, transport: ScriptedTransport) -> None:
        self._transport = transport
        self.probed = Probed()

    @property
    def transport(self) -> ScriptedTransport:
        return self._transport


REPORT = contract.LoadReport(2, 1, 0, 0.4, None, 0.35, 0.028)


async def test_refresh_asks_only_when_the_last_answer_is_out_of_date() -> None:
    clock = Clock(100.0)
    server = Server(ScriptedTransport(clock, REPORT, REPORT))
    await probes.refresh([server], RULES, clock)
    assert server.probed == Probed(LoadReport.of(REPORT), 100.0, NEVER, True)
    assert isinstance(server.probed.load, LoadReport)  # admission's reading of it
    clock.now = 100.2
    await probes.refresh([server], RULES, clock)  # within load_ttl_s: not asked
    assert server.transport.waited == [2.0]
    clock.now = 100.25
    await probes.refresh([server], RULES, clock)
    assert server.transport.waited == [2.0, None]  # answered once: the short wait now
    assert server.probed.fetched_at == 100.25


async def test_refresh_takes_a_failed_or_stale_server_down_for_down_for_s() -> None:
    clock = Clock(100.0)
    transport = ScriptedTransport(
        clock,
        REPORT,
        LoadTimeout("slow"),  # 1 s after its answer: kept
        LoadTimeout("slow"),  # 6 s after: too old, down
        REPORT,  # asked again once down_for_s has passed
        TTSError("unreachable"),  # down again
    )
    server = Server(transport)
    await probes.refresh([server], RULES, clock)
    clock.now = 101.0
    await probes.refresh([server], RULES, clock)
    assert (server.probed.load, server.probed.fetched_at) == (LoadReport.of(REPORT), 100.0)
    assert server.probed.up(clock.now)
    clock.now = 106.0
    transport.takes_s = 0.5  # the timeout comes half a second after it was asked
    await probes.refresh([server], RULES, clock)
    assert server.probed == Probed(None, 100.0, 108.5, True)
    transport.takes_s = 0.0
    clock.now = 108.0  # still down (and the only server: asked again, not refused blind)
    await probes.refresh([server], RULES, clock)
    assert server.probed.load == LoadReport.of(REPORT)
    assert server.probed.up(clock.now)
    clock.now = 108.25
    await probes.refresh([server], RULES, clock)
    assert server.probed == Probed(None, 108.0, 110.25, True)
    assert transport.answers == []


async def test_refresh_leaves_a_down_server_alone_while_another_is_up() -> None:
    clock = Clock(100.0)
    down = Server(ScriptedTransport(clock))  # never asked: no answer scripted
    down.probed = Probed().down(now=99.0, rules=RULES)
    up = Server(ScriptedTransport(clock, REPORT))
    await probes.refresh([down, up], RULES, clock)
    assert down.transport.waited == []
    assert down.probed.down_until == 101.0
    assert up.probed.load == LoadReport.of(REPORT)


async def test_a_server_marked_down_while_its_probe_waits_stays_down() -> None:
    clock = Clock(100.0)
    server = Server(ScriptedTransport(clock, REPORT))
    server.transport.takes_s = 0.5
    server.transport.during.append(lambda: probes.mark_down(server, RULES, clock))
    await probes.refresh([server], RULES, clock)
    assert server.probed.down_until == 102.5  # marked when the reply failed, 0.5 s in
    assert not server.probed.up(clock.now)
    assert server.probed.load == LoadReport.of(REPORT)  # what it said is kept


# --- the pool's probes, its probe client's answers scripted --------------------------------------

GOOD = orjson.dumps(REPORT.to_json())


async def test_the_pool_asks_load_and_readiness_on_its_clock() -> None:
    """A pool on a clock the test turns, its probe client answering `/load` from a script
    and `/ping` always: each is asked only when its answer is out of date; a bad answer takes
    the server down until `down_for_s` has passed on that clock."""
    clock = Clock(100.0)
    asked: list[str] = []
    loads = [GOOD, GOOD, b"[]", GOOD]

    def answer(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.path)
        if request.url.path == "/ping":
            return httpx.Response(200)
        return httpx.Response(200, content=loads.pop(0))

    async with httpx.AsyncClient() as client:
        probe = httpx.AsyncClient(transport=httpx.MockTransport(answer))
        servers = pool.ModelServerPool(["http://127.0.0.1:9"], client, probe=probe, clock=clock)
        try:
            first = await servers.pick(3.0)
            assert isinstance(first, pool.Upstream)
            clock.now = 100.125
            assert await servers.pick(3.0) is first  # its answer of 0.125 s ago serves
            assert asked == ["/load"]
            clock.now = 100.25
            assert await servers.pick(3.0) is first
            clock.now = 100.5
            refused = await servers.pick(3.0)  # "[]" is no load report: down
            assert isinstance(refused, Refusal)
            assert refused.code == "tts_unavailable"
            assert (first.up, first.load, first.probed.down_until) == (False, None, 102.5)
            assert asked == ["/load"] * 3
            clock.now = 102.5
            assert await servers.pick(3.0) is first  # down_for_s passed: asked, it answers
            assert asked == ["/load"] * 4

            assert await servers.ready()
            clock.now = 103.25
            assert await servers.ready()  # within ready_ttl_s: not asked again
            clock.now = 103.5
            assert await servers.ready()
            assert asked == ["/load"] * 4 + ["/ping"] * 2
        finally:
            await servers.aclose()
    assert loads == []


def test_the_pools_probe_settings_default_to_the_rules() -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(pool.ModelServerPool)}
    for rule in dataclasses.fields(ProbeRules):
        assert defaults[rule.name] == rule.default, rule.name
