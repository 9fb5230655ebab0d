"""The store a fleet of gateways shares (`--redis-url`): one Redis, and whether it answers.

Every call has a deadline (`--redis-timeout-s`) and is tried once: a Redis that is slow or
gone costs a request at most that, never a hang. The first failure turns the store
`degraded` (one log line, `gateway_fleet_up` 0, the internal `/readyz` says why) and no call
is tried while it is; a probe every `probe_s` rejoins it when Redis answers again (one log
line; first `on_rejoin` writes again what this gateway holds, which a restarted Redis lost). Callers
count on their own meanwhile (`gateway.fleet.limits`). A URL's password never reaches a log,
a reason or an error."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError, ResponseError

log = logging.getLogger(__name__)

# what a Redis that is gone, slow or refusing raises
FAILURES = (RedisError, OSError, TimeoutError)


def _reason(exc: BaseException) -> str:
    """Why a call failed, without what the exception says (it may name hosts or the URL)."""
    if isinstance(exc, TimeoutError):
        return "Redis did not answer in time"
    if isinstance(exc, ResponseError):  # it answered, and refused (out of memory, read-only)
        return f"Redis refused a call ({type(exc).__name__})"
    return f"Redis unreachable ({type(exc).__name__})"


class Store:
    """One Redis connection pool and its health."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str,
        timeout_s: float,
        probe_s: float = 1.0,
    ) -> None:
        """Raises `ValueError` for a URL Redis cannot take (its message names no secret)."""
        if timeout_s <= 0:
            raise ValueError("--redis-timeout-s must be more than 0")
        try:
            self.redis: aioredis.Redis = aioredis.Redis.from_url(
                url,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),  # tried once: the deadline is the caller's
                decode_responses=True,
                health_check_interval=0,
            )
        except ValueError:
            raise ValueError(
                "--redis-url is not a Redis URL (redis://[:password@]host:port/db, rediss:// "
                "for TLS, or unix:///path.sock)"
            ) from None
        self.gateway = uuid.uuid4().hex  # this gateway's name in the fleet, while it runs
        # every key in one hash slot: the scripts that take several keys work on a cluster
        self.prefix = "{" + prefix + "}:"
        self.timeout_s = timeout_s
        self.probe_s = probe_s
        self.up = False
        self.reason = "not started"
        self.on_change: list[Callable[[bool], None]] = []  # told each change after the start
        self.on_rejoin: list[Callable[[aioredis.Redis], Awaitable[object]]] = []
        self._probe: asyncio.Task[None] | None = None
        self.round_trips = 0  # calls that reached Redis and came back
        self.on_round_trip: Callable[[float], None] | None = None  # told each one's seconds

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    async def start(self) -> None:
        """Up if Redis answers now; degraded (and probing) if not: the gateway serves either
        way."""
        try:
            async with asyncio.timeout(self.timeout_s):
                await self.redis.ping()
        except FAILURES as exc:
            self._down(_reason(exc))
        else:
            self._set_up()

    async def call[T](self, what: Callable[[aioredis.Redis], Awaitable[T]]) -> T | None:
        """`what` done on Redis within the deadline; None while degraded, or when it fails
        (which degrades the store)."""
        if not self.up:
            return None
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                result = await what(self.redis)
        except FAILURES as exc:
            self._down(_reason(exc))
            return None
        self.round_trips += 1
        if self.on_round_trip is not None:
            self.on_round_trip(time.perf_counter() - start)
        return result

    def _set_up(self) -> None:
        if self.up:
            return
        was = self.reason
        self.up, self.reason = True, ""
        log.info("fleet: Redis answers; limits and sessions are shared")
        if was != "not started":
            for told in self.on_change:
                told(True)

    def _down(self, reason: str) -> None:
        if self.up or self.reason == "not started":
            log.warning("fleet: %s; counting on this gateway alone until it answers", reason)
            if self.up:
                for told in self.on_change:
                    told(False)
        self.up, self.reason = False, reason
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._probing(), name="fleet-probe")

    async def _probing(self) -> None:
        while not self.up:
            await asyncio.sleep(self.probe_s)
            try:
                async with asyncio.timeout(self.timeout_s):
                    await self.redis.ping()
                    for rejoin in self.on_rejoin:
                        await rejoin(self.redis)
            except FAILURES as exc:
                self.reason = _reason(exc)
                continue
            self._set_up()

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe
        with contextlib.suppress(*FAILURES):
            await self.redis.aclose()
