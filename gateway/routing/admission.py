"""Admission control and routing, pure: from each model server's published load (`GET /load`) to
which one takes a new reply, or a refusal with how long to wait.

A reply is taken only if its first audio can come within the budget (the chosen server's backlog
plus the first chunk's own synthesis) and taking it leaves the work there on time: segments queued
there with less slack than its first chunk's cost would be made late under EDF, and each reply this
gateway runs there must have spare time in its playback (`ChunkPlan.spare_profile`, from the text
it still has to voice) for what the new reply costs it: its share of the new first chunk, and the
slowdown of all it has left to synthesize now that one more reply shares the cores
(`LoadReport.slowdown`, from the speeds the server learned for calls alone and side by side, and on
a server that batches its decoder steps from its batch curve: one more reply in the batches costs
the others less, `kokoro_contract.capacity`; the server's `realtime_streams` is counted in batches
too). Each chunk it has still to come is asked separately (`ChunkPlan.spare_profile`): the new
start delays it by the new first chunk's share and by the slowdown of the synthesis before it, so a
chunk due soon needs less room than one at the end of a long reply, whose playback buffer grows
meanwhile. A reply still starting (nothing sent yet) has the slack its plan gives a first chunk
under load (`--first-slack-s`) and, its text unknown, a typical reply's synthesis left
(`LoadReport.reply_s`): on 2 cores two replies starting together would both fall behind, on a GPU
dozens may. Replies in progress are counted by what they ask the server for (an `Ask`,
`kokoro_contract.asks`: starting, or under way with the spare time of each chunk to come;
`placement.Upstream.asks` gives them); a reply that waits for its client's text with nothing asked
counts for nothing. What cannot be served in time is refused up front: never accepted and then
stuttered. A refusal that time clears by itself (a reply in progress gains spare time as its
synthesis runs ahead, one ends) is `deferrable`: the pool may hold the new reply a moment and ask
again (`waiting.WaitingLine.admit`) rather than refuse it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, Self

from gateway.reply.plan.config import FIRST_SLACK_S
from kokoro_contract import capacity
from kokoro_contract import load as contract
from kokoro_contract.asks import Ask, Spare
from kokoro_contract.load import FIRST_CHUNK_PHONEMES, SEGMENT_PHONEMES, SPEECH_S_PER_PHONEME

# a typical reply, for one still starting (its text unknown): the demo's five sentences,
# 230 phonemes in 6 chunks
REPLY_PHONEMES, REPLY_CALLS = 230, 6
RETRY_WHEN_FULL_S = 5  # a reply in progress needs a few seconds more, typically
STALE_ESTIMATE_FACTOR = 2.0  # an idle server is given a reply estimated up to this x budget


class InProgress(Protocol):
    """What admission needs of a reply in progress (its chunk plan, for one): whether it has
    started, and the spare time of each chunk it has still to come."""

    @property
    def started(self) -> bool: ...

    def spare_profile(self, now: float) -> Sequence[Spare]:
        """(spare seconds, seconds of synthesis until it is done) of each chunk still to come,
        in order; empty when nothing is left."""
        ...


@dataclass(frozen=True)
class LoadReport(contract.LoadReport):
    """A model server's `/load` answer (`kokoro_contract.load`) as admission reads it."""

    @classmethod
    def of(cls, report: contract.LoadReport) -> Self:
        """The same report (as the transport parsed it), read as admission reads it."""
        return cls(**dataclasses.asdict(report))

    @property
    def first_chunk_s(self) -> float:
        """What a new reply's start takes of a worker before its first audio: its first
        window on a progressive server, its whole first chunk on one whose unit is the chunk
        (its later windows are scheduled by their own deadlines, after others' due sooner)."""
        if self.first_window_s is not None:
            return self.first_window_s
        return self.seconds_per_call + self.seconds_per_phoneme * FIRST_CHUNK_PHONEMES

    def slowdown(self, replies: int) -> float:
        """How much longer the `replies` in progress take to synthesize what they have left
        once one more joins them (1.0 when none is in progress)."""
        if replies <= 0:
            return 1.0
        return self._per_reply_s(replies + 1) / self._per_reply_s(replies)

    def _per_reply_s(self, replies: int) -> float:
        """A typical segment's time for each of `replies` replies in progress: alone on all
        cores; beside others, at the speed of calls side by side, its decoder steps at their
        share of a batch of them all on a server that batches (`batch_curve`), and taking
        turns for the workers once there are more replies than workers."""
        each = self.seconds_per_call + self.seconds_per_phoneme * SEGMENT_PHONEMES  # alone
        a, b = self.shared_seconds_per_call, self.shared_seconds_per_phoneme
        if replies > 1 and self.workers > 1 and a is not None and b is not None:
            each = max(each, a + b * SEGMENT_PHONEMES)  # side by side is never faster per call
        speech = SEGMENT_PHONEMES * SPEECH_S_PER_PHONEME
        each = capacity.batched_s(each, speech, capacity.curve_of(self.batch_curve), replies)
        return each * max(1.0, replies / self.workers)

    @property
    def reply_s(self) -> float:
        """A typical reply's synthesis, at the speed of calls side by side when known."""
        a, b = self.shared_seconds_per_call, self.shared_seconds_per_phoneme
        if a is None or b is None or self.workers < 2:
            a, b = self.seconds_per_call, self.seconds_per_phoneme
        return REPLY_CALLS * a + b * REPLY_PHONEMES

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
    asks: tuple[Ask, ...] = ()  # of the replies this gateway runs there now
    first_slack_s: float = FIRST_SLACK_S  # the spare time a starting one has (--first-slack-s)

    @property
    def replies(self) -> int:
        """Replies this gateway runs there now that ask it for synthesis."""
        return len(self.asks)


def refusal(
    load: LoadReport,
    budget_s: float,
    asks: Sequence[Ask] = (),
    first_slack_s: float = FIRST_SLACK_S,
) -> Refusal | None:
    """Why `load` cannot take a new reply now, or None if it can; `asks`: what the replies
    this gateway already runs there ask of it, a starting one with `first_slack_s` of spare
    time."""
    replies = len(asks)
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
    startup = load.first_chunk_s / load.workers  # its first chunk goes ahead of them
    slower = load.slowdown(replies) - 1.0  # and what they have left runs this much longer
    starting = ((first_slack_s, load.reply_s),)  # its text unknown: a typical reply's work
    for ask in asks:
        profile = starting if ask.chunks is None else ask.chunks
        for slack, until in profile:
            needs = startup + slower * until
            if slack < needs:
                left = profile[-1][1]
                return Refusal(
                    f"replies in progress would fall behind their listeners (spare {slack:.2f} "
                    f"s, a new reply takes {needs:.2f} s of it)",
                    max(1, math.ceil(left)),  # when it has synthesized the text it knows
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
        refused = refusal(candidate.load, budget_s, candidate.asks, candidate.first_slack_s)
        if refused is None:
            return candidate
        refusals.append(refused)
    return next((r for r in refusals if r.deferrable), refusals[0])
