"""Per-client quotas, pure (the clock is a parameter): sessions open at once, in total, per
client and per subject, and amounts per minute (replies, LLM tokens) in a sliding window.

A client is a key's name, or an address when anonymous; a subject is one visitor among the
holders of a key's tokens (`Client.holder`), counted within the key's own share. Refusals are
`ServiceError`s with the HTTP status and code the routes answer: `503 overloaded` when the
gateway is full, `429 too_many_sessions` / `429 rate_limited` when one client, or one subject,
has its share.
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

    def __init__(self, sessions: Sessions, client: str, subject: str | None = None) -> None:
        self._sessions = sessions
        self.client = client
        self.subject = subject
        self.released = False
        self.also: Callable[[], None] | None = None  # given back with it (a fleet's lease)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._sessions.closed(self.client, self.subject)
            if self.also is not None:
                self.also()


def too_many_sessions(which: str, count: int) -> GatewayError:
    """The refusal of a session past a limit: `which` is `gateway` (its own), `fleet` (all
    gateways sharing a store), `client` or `subject`; `count` what it holds."""
    if which in ("gateway", "fleet"):
        return Overloaded(
            f"the {which} has {count} sessions open, its limit; retry shortly", retry_after_s=5
        )
    if which == "client":
        return TooManySessions(
            f"this client has {count} sessions open, the limit per client; close one first",
            retry_after_s=5,
        )
    return TooManySessions(
        f"this token's subject has {count} sessions open, the limit per subject; close one first",
        retry_after_s=5,
    )


def rate_limited(used: int, what: str, who: str, limit: int, wait_s: float) -> RateLimited:
    """The refusal of a reply whose window (`what` per `who`) has used its minute."""
    return RateLimited(
        f"{used} {what} in the last minute, the limit per {who} is {limit}",
        retry_after_s=max(1, math.ceil(wait_s)),
    )


class Sessions:
    def __init__(
        self,
        max_total: int,
        max_per_client: int,
        on_empty: Callable[[], None] | None = None,
        max_per_subject: int = 0,
    ) -> None:
        """`on_empty` is told each time the last open session closes; `max_per_subject`: 0
        for no limit."""
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.max_per_subject = max_per_subject
        self.on_empty = on_empty
        self.total = 0
        self._by_client: dict[str, int] = {}
        self._by_subject: dict[str, int] = {}

    def open(self, client: str, subject: str | None = None) -> Lease:
        """A session for `client`, and within it for `subject` (a `Client.holder`; None: the
        client's own)."""
        if self.total >= self.max_total:
            raise too_many_sessions("gateway", self.total)
        mine = self._by_client.get(client, 0)
        if mine >= self.max_per_client:
            raise too_many_sessions("client", mine)
        if subject is not None:
            theirs = self._by_subject.get(subject, 0)
            if 0 < self.max_per_subject <= theirs:
                raise too_many_sessions("subject", theirs)
            self._by_subject[subject] = theirs + 1
        self.total += 1
        self._by_client[client] = mine + 1
        return Lease(self, client, subject)

    def of(self, client: str) -> int:
        return self._by_client.get(client, 0)

    def of_subject(self, subject: str) -> int:
        return self._by_subject.get(subject, 0)

    def closed(self, client: str, subject: str | None = None) -> None:
        self.total -= 1
        _less(self._by_client, client)
        if subject is not None:
            _less(self._by_subject, subject)
        if not self.total and self.on_empty is not None:
            self.on_empty()


def _less(counts: dict[str, int], name: str) -> None:
    left = counts[name] - 1
    if left:
        counts[name] = left
    else:
        del counts[name]  # the table holds only those with sessions


class PerMinute:
    """At most `limit` units per client (or per `who`) in any 60 s (0: no limit)."""

    def __init__(self, limit: int, what: str, who: str = "client") -> None:
        self.limit = limit
        self.what = what
        self.who = who
        self._spent: defaultdict[str, deque[tuple[float, int]]] = defaultdict(deque)
        self._sweep_at = 0.0

    def check(self, client: str, now: float) -> None:
        """Raise `RateLimited` if `client` has used up its minute."""
        if self.limit <= 0:
            return
        used = self.used(client, now)
        if used >= self.limit:
            first = self._spent[client][0][0]
            raise rate_limited(used, self.what, self.who, self.limit, first + WINDOW_S - now)

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
