"""Admission control and routing, pure: from each model server's published load (`GET /load`)
to which one takes a new reply, or a refusal with how long to wait.

A reply is taken only if its first audio can come within the budget (the chosen server's
backlog plus the first chunk's own synthesis) and taking it leaves the work there on time: the
new reply's first chunks go ahead of everything with slack, so segments queued there with less
slack than its first chunk's cost, or replies this gateway runs there whose playback has less
spare time than its start costs them (`ChunkPlan.slack_s`, from the text they still have to
voice), would be made late. What cannot be served in time is refused up front: never accepted
and then stuttered. A refusal that time clears by itself (a reply in progress gains spare time
as its synthesis runs ahead, one ends) is `deferrable`: the pool may hold the new reply a
moment and ask again (`ModelServerPool.pick`) rather than refuse it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

FIRST_CHUNK_PHONEMES = 45  # a typical first chunk: one short sentence or clause
STARTUP_CHUNKS = 2  # a new reply's chunks that go ahead of replies with slack: its first two
RETRY_WHEN_FULL_S = 5  # a reply in progress needs a few seconds more, typically
STALE_ESTIMATE_FACTOR = 2.0  # an idle server is given a reply estimated up to this x budget


@dataclass(frozen=True)
class LoadReport:
    workers: int
    busy: int
    waiting: int
    backlog_s: float
    min_slack_s: float | None
    seconds_per_call: float
    seconds_per_phoneme: float
    realtime_streams: float = 1e9  # replies it can voice at once (older servers: unbounded)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> LoadReport:
        slack = body.get("min_slack_s")
        return cls(
            workers=int(body["workers"]),
            busy=int(body["busy"]),
            waiting=int(body["waiting"]),
            backlog_s=float(body["backlog_s"]),
            min_slack_s=None if slack is None else float(slack),
            seconds_per_call=float(body["seconds_per_call"]),
            seconds_per_phoneme=float(body["seconds_per_phoneme"]),
            realtime_streams=float(body.get("realtime_streams", 1e9)),
        )

    @property
    def first_chunk_s(self) -> float:
        return self.seconds_per_call + self.seconds_per_phoneme * FIRST_CHUNK_PHONEMES

    @property
    def first_audio_s(self) -> float:
        """When a new reply's first audio would come: the wait for a worker, then its chunk."""
        wait = self.backlog_s if self.busy >= self.workers else 0.0
        return wait + self.first_chunk_s


@dataclass(frozen=True)
class Refusal:
    reason: str
    retry_after_s: int
    code: str = "overloaded"  # or tts_unavailable: no model server answers at all
    deferrable: bool = False  # clears as replies in progress synthesize: worth asking again


@dataclass(frozen=True)
class Candidate:
    name: str
    load: LoadReport | None  # None: down (or its load is unknown)
    replies: int = 0  # replies this gateway runs there now
    slack_s: float | None = None  # the least spare time of their playback (None: no work)
    slack_clears_s: float = 0.0  # when that reply's known text is all synthesized


def refusal(
    load: LoadReport,
    budget_s: float,
    replies: int = 0,
    slack_s: float | None = None,
    slack_clears_s: float = 0.0,
) -> Refusal | None:
    """Why `load` cannot take a new reply now, or None if it can; `replies`: the ones this
    gateway already runs there, `slack_s` the least spare time of their playback, and
    `slack_clears_s` how long until the reply with that least has synthesized all it knows."""
    idle = load.busy == 0 and load.waiting == 0 and load.min_slack_s is None and replies == 0
    if idle and load.first_audio_s <= STALE_ESTIMATE_FACTOR * budget_s:
        # idle, and the estimate only a little past the budget: it may be stale (learned while
        # the machine was busy), and refusing would keep it so forever, since only served
        # replies correct it; nothing is served sooner by refusing
        return None
    # a reply synthesizes ahead of its playback, so replies overlap only in part: as many at
    # once as the nearest whole number of real-time streams
    capacity = max(1, round(load.realtime_streams))
    if replies >= capacity:
        return Refusal(
            f"{replies} replies in progress use all of its real-time capacity ({capacity})",
            RETRY_WHEN_FULL_S,
            deferrable=True,
        )
    first = load.first_audio_s
    if first > budget_s:
        wait = math.ceil(first - budget_s) + 1
        return Refusal(
            f"first audio would take {first:.1f} s; the budget is {budget_s:.1f} s", wait
        )
    if load.min_slack_s is not None and load.min_slack_s < load.first_chunk_s:
        return Refusal(
            f"replies in progress would miss their deadlines (slack {load.min_slack_s:.2f} s)",
            math.ceil(load.first_chunk_s - load.min_slack_s) + 1,
            deferrable=True,
        )
    startup = STARTUP_CHUNKS * load.first_chunk_s / load.workers  # what it takes from them
    if slack_s is not None and slack_s < startup:
        return Refusal(
            f"replies in progress would fall behind their listeners (spare {slack_s:.2f} s)",
            max(1, math.ceil(slack_clears_s)),
            deferrable=True,
        )
    return None


def choose(candidates: Sequence[Candidate], budget_s: float | None) -> Candidate | Refusal:
    """The up server that can take the reply whose first audio would come soonest (any, with
    no budget: admission control off); if none can, why the least loaded cannot, or the first
    that time may clear (deferrable) when there is one."""
    up = [c for c in candidates if c.load is not None]
    if not up:
        return Refusal("no model server is reachable", 2, "tts_unavailable")

    def spare(c: Candidate) -> tuple[float, float, str]:
        assert c.load is not None
        return (c.replies - c.load.realtime_streams, c.load.first_audio_s, c.name)

    ranked = sorted(up, key=spare)
    if budget_s is None:
        return ranked[0]
    refusals = []
    for candidate in ranked:
        assert candidate.load is not None
        refused = refusal(
            candidate.load,
            budget_s,
            candidate.replies,
            candidate.slack_s,
            candidate.slack_clears_s,
        )
        if refused is None:
            return candidate
        refusals.append(refused)
    return next((r for r in refusals if r.deferrable), refusals[0])
