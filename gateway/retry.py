"""One retry policy for every edge (model server, SageMaker, Bedrock, OpenAI-compatible LLMs).

Only what is safe is retried: an attempt that failed with a retryable error before anything was
said (no text shown, no audio played), and only while the next attempt can still start before
the reply's deadline for first audio. Waits grow exponentially with full jitter (so replies
that failed together do not retry together) up to `max_s`. After audio has started nothing is
retried blind: a TTS stream may resume on another server from where the listener is
(`may_resume`, asked through `next_try` by `gateway.transports.framed_stream`), and otherwise the
reply ends with an `error` event that says `retryable`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.aio import Clock, loop_time
from kokoro_contract.errors import ServiceError


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4  # tries in all, the first included
    base_s: float = 0.1
    max_s: float = 1.0

    def delay(self, retry: int, rng: random.Random | None = None) -> float:
        """The wait before retry number `retry` (1, 2, ...): full jitter under the cap."""
        ceiling = min(self.max_s, self.base_s * 2 ** (retry - 1))
        return (rng or random).uniform(0.0, ceiling)


OnRetry = Callable[[BaseException, float], None]  # told of each retry: the error, the wait
DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(attempts=1)


def is_retryable(exc: BaseException) -> bool:
    return isinstance(exc, ServiceError) and exc.retryable


@dataclass
class RetryBudget:
    """One reply's tries at one edge: how many are left, until when the next may start (the
    reply's first-audio deadline, on the running loop's clock) and whether anything was said
    (then none). Every retry path asks it: `retrying`, the resuming TTS stream, its batch call
    and the pool's failover, so none re-derives attempts, lateness or "already started"."""

    policy: RetryPolicy
    deadline: float | None = None  # on `clock`
    on_retry: OnRetry | None = None
    clock: Clock = loop_time
    failures: int = 0
    started: bool = False  # text shown or audio played: nothing may be retried now

    def retry_after(
        self, exc: BaseException, retryable: Callable[[BaseException], bool] = is_retryable
    ) -> float | None:
        """Counts the failure `exc`; the wait before the next try, or None when the caller
        must fail with `exc` now (it is final, something was said, no tries or time left)."""
        self.failures += 1
        if self.started or not retryable(exc) or self.failures >= self.policy.attempts:
            return None
        wait = self.policy.delay(self.failures)
        if self.deadline is not None and self.clock() + wait >= self.deadline:
            return None
        if self.on_retry is not None:
            self.on_retry(exc, wait)
        return wait

    def may_resume(self, exc: BaseException) -> bool:
        """After audio has started: whether the reply may go on elsewhere after `exc` (its
        session was lost or stalled), its unheard text sent again; counts a try. Unlike a
        retry, it waits for nothing: the listener is hearing what was buffered meanwhile."""
        self.failures += 1
        return is_retryable(exc) and self.failures < self.policy.attempts

    def next_try(self, exc: BaseException, resumable: bool = False) -> float | None:
        """The one decision after a TTS try failed with `exc`: the wait before the next (0: at
        once), or None when the caller must fail with `exc` now. Before anything was said, a
        retry (`retry_after`); after, a resume from where the listener is, for a caller that
        can resume elsewhere (`resumable`) while `may_resume` allows; otherwise none."""
        if self.started:
            return 0.0 if resumable and self.may_resume(exc) else None
        return self.retry_after(exc)

    def may_fail_over(self, exc: BaseException) -> bool:
        """Whether another server may take over at once after `exc` (unreachable before
        anything was said): no wait, no try counted, since nothing reached the listener."""
        return not self.started and isinstance(exc, ServiceError)


async def retrying[T](
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy | RetryBudget,
    *,
    deadline: float | None = None,
    retryable: Callable[[BaseException], bool] = is_retryable,
    on_retry: OnRetry | None = None,
) -> T:
    """`attempt()` until it succeeds, fails for good, runs out of tries, or the next try could
    not start before `deadline` (the running loop's clock); the last error is raised. A
    `RetryBudget` given instead of a policy is shared with the caller's other tries."""
    budget = policy if isinstance(policy, RetryBudget) else RetryBudget(policy, deadline, on_retry)
    while True:
        try:
            return await attempt()
        except Exception as exc:
            wait = budget.retry_after(exc, retryable)
            if wait is None:
                raise
            await asyncio.sleep(wait)
