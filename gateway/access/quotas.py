"""Per-client quotas, pure (the clock is a parameter): sessions open at once, in total and per
client, and amounts per minute (replies, LLM tokens) in a sliding window.

A client is a key's name, or an address when anonymous. Refusals are `ServiceError`s with the
HTTP status and code the routes answer: `503 overloaded` when the gateway is full, `429
too_many_sessions` / `429 rate_limited` when one client has its share.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Callable

from gateway.errors import GatewayError, Overloaded

WINDOW_S = 60.0


class TooManySessions(GatewayError):
    code = "too_many_sessions"
    status = 429
    retryable = True


class RateLimited(GatewayError):
    code = "rate_limited"
    status = 429
    retryable = True


class Lease:
    """One open session; `release()` may be called any number of times."""

    def __init__(self, sessions: Sessions, client: str) -> None:
        self._sessions = sessions
        self.client = client
        self.released = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._sessions.closed(self.client)


class Sessions:
    def __init__(
        self, max_total: int, max_per_client: int, on_empty: Callable[[], None] | None = None
    ) -> None:
        """`on_empty` is told each time the last open session closes."""
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.on_empty = on_empty
        self.total = 0
        self._by_client: dict[str, int] = {}

    def open(self, client: str) -> Lease:
        if self.total >= self.max_total:
            raise Overloaded(
                f"the gateway has {self.total} sessions open, its limit; retry shortly",
                retry_after_s=5,
            )
        mine = self._by_client.get(client, 0)
        if mine >= self.max_per_client:
            raise TooManySessions(
                f"this client has {mine} sessions open, the limit per client; close one first",
                retry_after_s=5,
            )
        self.total += 1
        self._by_client[client] = mine + 1
        return Lease(self, client)

    def of(self, client: str) -> int:
        return self._by_client.get(client, 0)

    def closed(self, client: str) -> None:
        self.total -= 1
        left = self._by_client[client] - 1
        if left:
            self._by_client[client] = left
        else:
            del self._by_client[client]  # the table holds only clients with sessions
        if not self.total and self.on_empty is not None:
            self.on_empty()


class PerMinute:
    """At most `limit` units per client in any 60 s (0: no limit)."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self._spent: defaultdict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._sweep_at = 0.0

    def check(self, client: str, now: float) -> None:
        """Raise `RateLimited` if `client` has used up its minute."""
        if self.limit <= 0:
            return
        used = self.used(client, now)
        if used >= self.limit:
            first = self._spent[client][0][0]
            wait = max(1, math.ceil(first + WINDOW_S - now))
            raise RateLimited(
                f"{used} {self.what} in the last minute, the limit per client is {self.limit}",
                retry_after_s=wait,
            )

    def charge(self, client: str, amount: int, now: float) -> None:
        if self.limit > 0 and amount > 0:
            self._spent[client].append((now, amount))
        if now >= self._sweep_at:  # once a minute, forget clients that went quiet
            self._sweep_at = now + WINDOW_S
            for name in list(self._spent):
                self._forget(name, now)

    def clients(self) -> int:
        return len(self._spent)

    def used(self, client: str, now: float) -> int:
        self._forget(client, now)
        return sum(amount for _, amount in self._spent.get(client, ()))

    def _forget(self, client: str, now: float) -> None:
        spent = self._spent.get(client)
        if spent is None:
            return
        while spent and spent[0][0] <= now - WINDOW_S:
            spent.popleft()
        if not spent:
            del self._spent[client]  # idle clients cost no memory
