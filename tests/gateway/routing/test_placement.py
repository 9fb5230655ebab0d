"""Placement (`gateway.routing.placement`) without sockets: what admission is told of each
server at a given time, where a reply's stream is opened first and where it fails over to, and
a reply's place moving with it. The servers' transports are never used here; the pool's
failover over real servers is in `test_pool.py` and `tests/end_to_end/test_realtime.py`."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from gateway.errors import TTSError
from gateway.routing.admission import Candidate, LoadReport
from gateway.routing.placement import (
    PooledTransport,
    Upstream,
    candidates,
    failover_order,
    wedged,
)
from gateway.routing.probes import Probed, ProbeRules
from gateway.transports.model_server import ModelServerTransport
from kokoro_contract.asks import Ask

RULES = ProbeRules()


def load(backlog_s: float, busy: int = 2) -> LoadReport:
    """Two workers, `busy` of them busy, `backlog_s` of work queued."""
    return LoadReport(2, busy, 0, backlog_s, None, 0.35, 0.028)


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Servers:
    """The pool as a reply's place uses it: its servers, and what it was told."""

    def __init__(self, *upstreams: Upstream) -> None:
        self.upstreams = list(upstreams)
        self.marked: list[str] = []
        self.changes = 0

    def mark_down(self, upstream: Upstream) -> None:
        self.marked.append(upstream.url)

    def changed(self) -> None:
        self.changes += 1


@pytest.fixture
async def server() -> AsyncIterator[Callable[[str, Probed], Upstream]]:
    """A server at a URL with what the probes learned of it, on one clock at 100 s."""
    clock = Clock(100.0)
    async with httpx.AsyncClient() as client:

        def make(url: str, probed: Probed) -> Upstream:
            return Upstream(url, ModelServerTransport(url, client), clock, probed)

        yield make


def answered(report: LoadReport) -> Probed:
    return Probed().reported(report, asked_at=99.9)


async def test_admission_is_told_a_down_servers_load_as_none(
    server: Callable[[str, Probed], Upstream],
) -> None:
    up = server("http://a", answered(load(0.5)))
    down = server("http://b", answered(load(0.0)).down(now=99.0, rules=RULES))  # until 101
    assert candidates([up, down], now=100.0, first_slack_s=1.0) == [
        Candidate("http://a", load(0.5), (), 1.0),
        Candidate("http://b", None, (), 1.0),
    ]
    # at 101 its time is up, but the load it gave was forgotten when it went down
    assert candidates([down], now=101.0, first_slack_s=1.0)[0].load is None


async def test_a_reply_fails_over_to_the_servers_up_soonest_first_audio_first(
    server: Callable[[str, Probed], Upstream],
) -> None:
    placed = server("http://placed", answered(load(3.0)))
    slow = server("http://slow", answered(load(2.0)))
    fast = server("http://fast", answered(load(1.0)))
    unknown = server("http://unknown", Probed())  # up, its load not asked yet: last
    down = server("http://down", answered(load(0.0)).down(now=99.0, rules=RULES))
    others = [slow, down, unknown, fast, placed]
    assert failover_order(placed, others, wedged=False) == [placed, fast, slow, unknown]
    # it froze on this reply: not opened there again, even though the reply is placed there
    assert failover_order(placed, others, wedged=True) == [fast, slow, unknown]


async def test_a_replys_place_is_held_until_it_ends_and_moves_with_it(
    server: Callable[[str, Probed], Upstream],
) -> None:
    first = server("http://a", answered(load(0.0, busy=0)))
    other = server("http://b", answered(load(0.0, busy=0)))
    servers = Servers(first, other)
    reply = PooledTransport(servers, first)
    assert reply.alone  # nothing else there, as its load said when it took the reply
    assert (first.replies, first.asks(0.0)) == (1, (Ask(),))  # starting
    reply._move(other)
    assert (first.replies, other.replies, reply.upstream) == (0, 1, other)
    waiting_for_text = True
    reply.track(None, lambda: waiting_for_text)
    assert (other.asking(), other.asks(0.0)) == ([], ())  # waits for its client: counts nothing
    waiting_for_text = False
    assert (other.asking(), other.asks(0.0)) == ([reply], (Ask.under_way(),))  # no plan
    reply.release()
    reply.release()  # once
    assert (first.replies, other.replies) == (0, 0)
    assert servers.changes == 3  # the move, the plan, the end: waiting replies look again
    assert servers.marked == []


def test_a_stream_silent_past_due_or_stalled_is_a_wedged_server() -> None:
    assert wedged(TTSError("late", code="tts_timeout"))
    assert wedged(ExceptionGroup("reply", [ValueError(), TTSError("x", code="tts_stalled")]))
    assert not wedged(TTSError("model server session lost"))
    assert not wedged(TimeoutError())
