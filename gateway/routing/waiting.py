"""New replies that no model server can take now, for a reason time clears (a reply in progress
needs its spare time, one is about to end), waiting for one that can: each may wait up to
`wait_s` while its first audio can still come within the budget, asked again whenever a
reply's chunk completes or a reply ends (`changed`) and at least every `recheck_s`, in arrival
order, at most `max_waiting` at once, and at most `per_client` of one client's: the spare time
that frees goes to the clients in turn, not all of it to the one that asked most."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator

from gateway.aio import Clock
from gateway.routing.admission import RETRY_WHEN_FULL_S, Refusal


class WaitingLine:
    """The replies waiting for spare time, in arrival order. Its clock must run at the event
    loop's pace (the waits are asyncio timeouts)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.count = 0  # new replies waiting for a server with spare time now
        self._by_client: dict[str, int] = {}  # of those, each client's
        self.turn = asyncio.Lock()  # those that wait are asked again in arrival order
        self._changed = asyncio.Event()  # set (and replaced) when a reply's plan moves on

    def changed(self) -> None:
        """A reply's chunk completed or a reply ended: replies waiting to start look again."""
        self._changed.set()
        self._changed = asyncio.Event()

    @contextlib.contextmanager
    def _joined(self, client: str) -> Iterator[None]:
        self.count += 1
        self._by_client[client] = self._by_client.get(client, 0) + 1
        try:
            yield
        finally:
            self.count -= 1
            if self._by_client[client] <= 1:
                del self._by_client[client]
            else:
                self._by_client[client] -= 1

    async def admit[U, R](
        self,
        pick: Callable[[float | None], Awaitable[U | Refusal]],
        reserve: Callable[[U], R],
        budget_s: float | None,
        wait_s: float,
        recheck_s: float,
        max_waiting: int,
        client: str = "",
        per_client: int = 0,
    ) -> R | Refusal:
        """A new reply's place: the server `pick` chooses for its budget, `reserve`d there
        before the next reply looks; when none can take it for a reason time clears, it waits
        up to `wait_s` behind the replies already waiting, its budget shrinking by the time
        waited. `client`: whose reply it is, of whom at most `per_client` replies wait at
        once (0: no limit): one more is refused at once."""
        start = self._clock()
        chosen = await pick(budget_s)
        if not isinstance(chosen, Refusal) and not self.count:
            return reserve(chosen)
        if isinstance(chosen, Refusal) and not chosen.deferrable:
            return chosen
        if budget_s is None or wait_s <= 0 or self.count >= max_waiting:
            return chosen if isinstance(chosen, Refusal) else reserve(chosen)
        if per_client and self._by_client.get(client, 0) >= per_client:
            return Refusal(
                f"{per_client} of this client's replies already wait for spare time",
                RETRY_WHEN_FULL_S,
            )
        with self._joined(client):
            try:
                async with asyncio.timeout(wait_s - (self._clock() - start)), self.turn:
                    while True:
                        changed = self._changed
                        chosen = await pick(budget_s - (self._clock() - start))
                        if not isinstance(chosen, Refusal):
                            return reserve(chosen)  # reserved before the next looks
                        if not chosen.deferrable:
                            return chosen
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(recheck_s):
                                await changed.wait()
            except TimeoutError:
                last = await pick(budget_s - (self._clock() - start))
                return last if isinstance(last, Refusal) else reserve(last)
