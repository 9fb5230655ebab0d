"""One retry policy for every edge (model server, SageMaker, Bedrock, OpenAI-compatible LLMs).

Only what is safe is retried: an attempt that failed with a retryable error before anything was
said (no text shown, no audio played), and only while the next attempt can still start before
the reply's deadline for first audio. Waits grow exponentially with full jitter (so replies
that failed together do not retry together) up to `max_s`. After audio has started nothing is
retried: the reply ends with an `error` event that says `retryable`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

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


async def retrying[T](
    attempt: Callable[[], Awaitable[T]],
    policy: RetryPolicy,
    *,
    deadline: float | None = None,
    retryable: Callable[[BaseException], bool] = is_retryable,
    on_retry: OnRetry | None = None,
) -> T:
    """`attempt()` until it succeeds, fails for good, runs out of tries, or the next try could
    not start before `deadline` (the running loop's clock); the last error is raised."""
    loop = asyncio.get_running_loop()
    for n in range(1, policy.attempts + 1):
        try:
            return await attempt()
        except Exception as exc:
            wait = policy.delay(n)
            late = deadline is not None and loop.time() + wait >= deadline
            if n == policy.attempts or late or not retryable(exc):
                raise
            if on_retry is not None:
                on_retry(exc, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")
