"""Sessions open and amounts per minute counted across a fleet of gateways, in Redis.

The rules are `gateway.access.quotas`'s, counted where every gateway sees them:
- **Sessions**: a sorted set per limit (the fleet's, a client's, a token subject's) whose
  members are leases, scored by when they expire. A gateway heartbeats its live leases every
  third of `lease_ttl_s`; one that dies stops, and its leases expire within `lease_ttl_s`.
  Opening is one script: expired leases dropped, each count checked against its limit, the
  lease added to every set, atomically (no two gateways both take a client's last place).
- **Per minute**: a sorted set per window (replies of a client, of a subject; LLM tokens of a
  client) of charges scored by when they were made, each member `<id>:<amount>`. Checking and
  charging is one script: what is older than 60 s dropped, each window summed against its
  limit, and, when none is reached, the charges added.
Time is Redis's own (`TIME` in the scripts), so gateways' clocks need not agree. A reply costs
two round trips (its rates; its tokens at its end, answered later), a WebSocket one more at
its opening and one at its close; the heartbeat one per gateway every third of the TTL.

While the store is degraded, nothing here is asked (`Store.call` answers None) and the gate
counts on its own, as a single gateway does; the leases it opened meanwhile are written when
Redis answers again (`rejoin`), so the counts are whole once more."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import redis.asyncio as aioredis

from gateway.fleet.store import Store

WINDOW_MS = 60_000

# KEYS: the lease's sets; ARGV: lease id, TTL (ms), then each set's limit (0: none).
# Returns {0, 0}, or {i, n}: the i-th set (1-based) already holds n leases, its limit.
_OPEN = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ttl = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local limit = tonumber(ARGV[2 + i])
  local n = redis.call('ZCARD', key)
  if limit > 0 and n >= limit then return {i, n} end
end
for _, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + ttl, ARGV[1])
  redis.call('PEXPIRE', key, ttl)
end
return {0, 0}
"""

# KEYS: sets; ARGV: TTL (ms), then the lease in each set: each lease's expiry moved on.
_HEARTBEAT = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ttl = tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  redis.call('ZADD', key, now + ttl, ARGV[1 + i])
  redis.call('PEXPIRE', key, ttl)
end
return #KEYS
"""

# KEYS: windows; ARGV: a charge id, then per window its limit (0: not checked) and the
# amount to charge (0: none). Returns {0, 0, 0}, or {i, used, wait_ms}: the i-th window has
# used its minute, and its oldest charge leaves it in wait_ms.
_RATES = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local window = tonumber(ARGV[2 + 2 * #KEYS])
for i, key in ipairs(KEYS) do
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
  local limit = tonumber(ARGV[2 * i])
  if limit > 0 then
    local used = 0
    for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      used = used + tonumber(string.match(member, ':(%d+)$'))
    end
    if used >= limit then
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      return {i, used, tonumber(oldest[2]) + window - now}
    end
  end
end
for i, key in ipairs(KEYS) do
  local amount = tonumber(ARGV[2 * i + 1])
  if amount > 0 then
    redis.call('ZADD', key, now, ARGV[1] .. ':' .. amount)
    redis.call('PEXPIRE', key, window + 1000)
  end
end
return {0, 0, 0}
"""


@dataclass(frozen=True)
class Full:
    """A limit reached: which (`fleet`, `client`, `subject`) and how many it holds."""

    which: str
    count: int


@dataclass(frozen=True)
class Window:
    """One per-minute window to check (`limit` > 0) and charge (`amount` > 0)."""

    name: str  # replies:client:<name>, tokens:client:<name>, ...
    limit: int
    amount: int


@dataclass(frozen=True)
class Used:
    """A window that has used its minute: its index among those asked, what it used, and
    how long until its oldest charge leaves it."""

    index: int
    used: int
    wait_s: float


class SharedLimits:
    def __init__(
        self,
        store: Store,
        *,
        lease_ttl_s: float,
        max_fleet_sessions: int,
        max_per_client: int,
        max_per_subject: int,
    ) -> None:
        if lease_ttl_s <= 0:
            raise ValueError("--fleet-lease-ttl-s must be more than 0")
        self.store = store
        self.ttl_ms = int(lease_ttl_s * 1000)
        self.limits = (max_fleet_sessions, max_per_client, max_per_subject)
        self._live: dict[str, tuple[str, ...]] = {}  # this gateway's leases -> their sets
        self._open = store.redis.register_script(_OPEN)
        self._heartbeat = store.redis.register_script(_HEARTBEAT)
        self._rates = store.redis.register_script(_RATES)
        self._tasks: set[asyncio.Task[object]] = set()  # writes nobody waits for
        self._beating: asyncio.Task[None] | None = None
        store.on_rejoin.append(self._write_live)

    @property
    def live(self) -> int:
        return len(self._live)

    async def open_session(self, client: str, subject: str | None) -> tuple[str, Full | None]:
        """A lease for one session of `client` (and `subject`, a token's holder): its id, and
        the limit it met (it holds nothing then), or None when it is counted, or when the store
        does not answer (it is written when it does)."""
        lease = uuid.uuid4().hex
        which = ["fleet", "client"] + (["subject"] if subject is not None else [])
        sets = [self.store.key("sessions", "all"), self.store.key("sessions", "client", client)]
        if subject is not None:
            sets.append(self.store.key("sessions", "subject", subject))
        limits = [str(limit) for limit in self.limits[: len(sets)]]
        answer = await self.store.call(
            lambda _: self._open(keys=sets, args=[lease, self.ttl_ms, *limits])
        )
        if answer is not None and int(answer[0]):
            return lease, Full(which[int(answer[0]) - 1], int(answer[1]))
        self._live[lease] = tuple(sets)
        return lease, None

    def close_session(self, lease: str) -> None:
        """The lease given back (answered later: the session has ended already)."""
        sets = self._live.pop(lease, None)
        if sets is None or not self.store.up:
            return

        async def remove(redis: aioredis.Redis) -> object:
            async with redis.pipeline(transaction=False) as pipe:
                for key in sets:
                    pipe.zrem(key, lease)
                return await pipe.execute()

        self._later(remove)

    async def charge(self, windows: Sequence[Window]) -> Used | None:
        """Each window checked and, when none has used its minute, charged, at once; None too
        when the store does not answer (the gate's own windows decide then)."""
        asked = [i for i, w in enumerate(windows) if w.limit > 0 or w.amount > 0]
        if not asked:
            return None
        keys = [self.store.key("rate", windows[i].name) for i in asked]
        args: list[str | int] = [uuid.uuid4().hex]
        for i in asked:
            args += [windows[i].limit, windows[i].amount]
        args.append(WINDOW_MS)
        answer = await self.store.call(lambda _: self._rates(keys=keys, args=args))
        if answer is None or not int(answer[0]):
            return None
        return Used(asked[int(answer[0]) - 1], int(answer[1]), int(answer[2]) / 1000)

    def charge_later(self, windows: Sequence[Window]) -> None:
        """Charges that refuse nothing now (an LLM answer's tokens, at its end)."""
        if self.store.up:
            self._later(lambda _: self.charge(windows))

    async def start(self) -> None:
        self._beating = asyncio.create_task(self._beat(), name="fleet-heartbeat")

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl_ms / 3000)
            if self._live:
                await self.store.call(self._write_live)

    async def _write_live(self, redis: aioredis.Redis) -> object:
        """Every live lease's expiry moved on, and written where Redis lost it (restarted)."""
        keys: list[str] = []
        members: list[str] = []
        for lease, sets in self._live.items():
            keys += sets
            members += [lease] * len(sets)
        if not keys:
            return 0
        return await self._heartbeat(keys=keys, args=[self.ttl_ms, *members], client=redis)

    def _later(self, write: Callable[[aioredis.Redis], Awaitable[object]]) -> None:
        task: asyncio.Task[object] = asyncio.create_task(self.store.call(write))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settled(self) -> None:
        """The writes nobody waits for, done (each within the store's deadline)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def aclose(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._beating
        await self.settled()
