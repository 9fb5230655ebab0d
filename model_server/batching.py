"""Which due decoder steps run together as one batched engine call, and when (pure).

With `--batch on` each session's decoder steps (a block of its segment's frames pushed into the
streamed generator) are not run one by one: the steps that are due from several sessions and
can be stacked (the same shape class, `Due.key`: a block of as many frames, each past its
segment's first, so that their carried states have the same shapes) run as one call, each
session's rows its own (`engines/batcher.py` runs them; `engines/stream_batch.py` stacks the
state).

The rule (`form`), over the steps due now:
- earliest deadline first: the step whose audio is needed first (`Due.deadline`) leads, and
  the batch is the steps of its shape class, by deadline, as many as `Policy.max_size`;
- no larger than the lead's deadline allows: where the learned time per batch size
  (`BatchCurve`) says a batch of `n` would finish after it and a smaller one would not, the
  batch is the largest that does (a first window is never made late to fill a batch);
- a step may wait for others (`Policy.window_s` after it came, never past the moment its
  deadline needs it to start) only while other sessions are decoding and may ask within it
  (`coming`): a lone session never waits.

A step cancelled while it waits leaves the queue (its caller's business: it is no longer
given here); one cancelled inside a running batch gets its rows, which it drops.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kokoro_contract import capacity

# the time per batch of n is learned as seconds per frame of each of the n rows' blocks
_DECAY = 0.8  # each new batch scales the weight of the older ones by this


@dataclass(frozen=True)
class Due:
    """A decoder step waiting to run: `key` says what it may be batched with, `frames` its
    block's, `deadline` when its audio is needed, `arrived` when it asked (one clock)."""

    id: Hashable
    key: Hashable
    frames: int
    deadline: float
    arrived: float


@dataclass(frozen=True)
class Policy:
    window_s: float = 0.004  # how long a due step may wait for others (`--batch-window-ms`)
    max_size: int = 16  # rows in one call at most

    def __post_init__(self) -> None:
        if self.window_s < 0:
            raise ValueError("a batch window is not negative")
        if self.max_size < 1:
            raise ValueError("a batch has at least one row")


@dataclass(frozen=True)
class Run:
    """Run these steps now, as one call, in this order."""

    ids: tuple[Hashable, ...]


@dataclass(frozen=True)
class Wait:
    """Nothing to run before `until` (or before another step comes)."""

    until: float


@dataclass
class BatchCurve:
    """The learned time of a batched step by its rows: seconds per frame of a block (each row
    that block's size), by batch size, an exponentially weighted mean of what batches took.
    A size not seen yet is read from the nearest seen below it, as if its rows cost as much as
    alone (no gain assumed), or None where none is."""

    seconds_per_frame: dict[int, float] = field(default_factory=dict)
    batches: dict[int, int] = field(default_factory=dict)

    def observe(self, size: int, frames: int, seconds: float) -> None:
        if size < 1 or frames < 1 or seconds < 0:
            return
        per_frame = seconds / frames
        known = self.seconds_per_frame.get(size)
        self.seconds_per_frame[size] = (
            per_frame if known is None else _DECAY * known + (1 - _DECAY) * per_frame
        )
        self.batches[size] = self.batches.get(size, 0) + 1

    def seconds(self, size: int, frames: int) -> float | None:
        """How long a batch of `size` rows of `frames` frames takes, as learned
        (`capacity.batch_seconds`: the gateway's admission reads the curve alike)."""
        return capacity.batch_seconds(self.seconds_per_frame, size, frames)

    def report(self) -> dict[str, float]:
        """`GET /load`'s `batch_curve`: seconds per frame of every row's block by batch size
        seen, by size."""
        return {str(n): round(v, 6) for n, v in sorted(self.seconds_per_frame.items())}


def form(
    due: Sequence[Due], now: float, policy: Policy, curve: BatchCurve, coming: int = 0
) -> Run | Wait | None:
    """What to do with the steps `due` (none: None): run a batch now, or wait (module
    docstring). `coming` is how many other sessions are decoding and may ask soon."""
    if not due:
        return None
    order = sorted(due, key=lambda d: (d.deadline, d.arrived))
    lead = order[0]
    same = [d for d in order if d.key == lead.key][: policy.max_size]
    size = _fitting(len(same), lead, now, curve)
    batch = same[:size]
    if size == len(same) and size < policy.max_size and coming > 0:
        until = lead.arrived + policy.window_s
        bigger = curve.seconds(size + 1, lead.frames)
        if bigger is not None:  # never wait past the moment a larger batch must start
            until = min(until, lead.deadline - bigger)
        if until > now:
            return Wait(until)
    return Run(tuple(d.id for d in batch))


def _fitting(count: int, lead: Due, now: float, curve: BatchCurve) -> int:
    """The rows to run: all `count`, unless a batch that large would finish after the lead's
    deadline where a smaller one would not (then the largest that does)."""
    for size in range(count, 0, -1):
        took = curve.seconds(size, lead.frames)
        if took is None or now + took <= lead.deadline:
            return size
    return count  # late whatever is run: the most rows per call
