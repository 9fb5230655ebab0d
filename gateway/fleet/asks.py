"""Admission across a fleet: what every gateway's replies ask of each model server, in Redis.

Admission weighs a model server's `/load` against what the replies placed there ask of it
(`kokoro_contract.asks.Ask`); a gateway alone knows only its own. Here each gateway publishes
its asks per server (a hash per server, a field per gateway whose value carries its expiry),
and reads the others' when it picks a server for a new reply, so N gateways in front of one
model server admit what one gateway would.

- **Read**: one script per pick for every server the gateway knows: the other gateways'
  fields, those expired dropped (Redis's `TIME`: the gateways' clocks need not agree).
- **Write**: at once when its asks change (a reply admitted, a chunk done, a reply ended),
  at most every `MIN_INTERVAL_S` after that, and every `REFRESH_S` while it has replies, so
  that a gateway that dies leaves nothing behind past `TTL_S`.
- **What it costs**: a round trip before each admission and one after, each within the
  store's deadline. Two gateways that admit within one round trip of each other do not see
  each other's new reply (the window is the round trip: under a millisecond on a LAN).
- An ask is published as the gateway computed it (the spare time of each chunk from that
  moment) and read unchanged until the next write, up to `REFRESH_S` later.

While the store is degraded the gateway admits on its own asks, as one gateway does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

import orjson
import redis.asyncio as aioredis

from gateway.fleet.store import Store
from kokoro_contract.asks import Ask

TTL_S = 2.0  # a gateway's asks are dropped this long after its last write
REFRESH_S = 0.5  # written again this often while it has any
MIN_INTERVAL_S = 0.05  # writes that changes call for, at most this often

# KEYS: each server's hash; ARGV: this gateway, TTL (ms), then each hash's value ("": none).
_WRITE = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local ttl = tonumber(ARGV[2])
for i, key in ipairs(KEYS) do
  local value = ARGV[2 + i]
  if value == '' then
    redis.call('HDEL', key, ARGV[1])
  else
    redis.call('HSET', key, ARGV[1], (now + ttl) .. '|' .. value)
    redis.call('PEXPIRE', key, 2 * ttl)
  end
end
return #KEYS
"""

# KEYS: each server's hash; ARGV: this gateway. Returns, per hash, the other gateways'
# values still alive (those past their expiry are deleted).
_READ = """
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local out = {}
for i, key in ipairs(KEYS) do
  local alive = {}
  local fields = redis.call('HGETALL', key)
  for j = 1, #fields, 2 do
    local name, value = fields[j], fields[j + 1]
    local bar = string.find(value, '|', 1, true)
    if tonumber(string.sub(value, 1, bar - 1)) < now then
      redis.call('HDEL', key, name)
    elseif name ~= ARGV[1] then
      table.insert(alive, string.sub(value, bar + 1))
    end
  end
  out[i] = alive
end
return out
"""


def encode(asks: Sequence[Ask]) -> str:
    """A gateway's asks on one server, as JSON: each null (starting) or its chunks'
    [spare, synthesis] pairs."""
    return orjson.dumps(
        [None if a.chunks is None else [list(c) for c in a.chunks] for a in asks]
    ).decode()


def decode(value: str) -> tuple[Ask, ...]:
    return tuple(
        Ask() if chunks is None else Ask.under_way((float(s), float(d)) for s, d in chunks)
        for chunks in orjson.loads(value)
    )


class FleetAsks:
    """What the other gateways of the fleet ask of each model server, and this one's asks,
    published. `mine` gives this gateway's asks per server URL now."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.name = store.gateway
        self._write = store.redis.register_script(_WRITE)
        self._read = store.redis.register_script(_READ)
        self._dirty = asyncio.Event()
        self._publishing: asyncio.Task[None] | None = None
        self._published: dict[str, str] = {}  # what this gateway last wrote, per server
        self._unwritten = False  # a write the store did not take: tried again

    def _key(self, url: str) -> str:
        return self.store.key("asks", url)

    async def others(self, urls: Sequence[str]) -> Mapping[str, tuple[Ask, ...]]:
        """What the other gateways' replies ask of each of `urls` now (nothing when the
        store does not answer)."""
        if not urls:
            return {}
        keys = [self._key(url) for url in urls]
        answer = await self.store.call(lambda _: self._read(keys=keys, args=[self.name]))
        if answer is None:
            return {}
        return {
            url: tuple(ask for value in values for ask in decode(value))
            for url, values in zip(urls, answer, strict=True)
        }

    def changed(self) -> None:
        """This gateway's asks changed: written soon."""
        self._dirty.set()

    async def start(self, mine: Callable[[], Mapping[str, Sequence[Ask]]]) -> None:
        self._publishing = asyncio.create_task(self._publish(mine), name="fleet-asks")

    async def _publish(self, mine: Callable[[], Mapping[str, Sequence[Ask]]]) -> None:
        while True:
            if self._published or self._unwritten:  # written again before they expire
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(REFRESH_S):
                        await self._dirty.wait()
            else:
                await self._dirty.wait()
            self._dirty.clear()
            now = {url: encode(asks) if asks else "" for url, asks in mine().items()}
            values = {url: v for url, v in now.items() if v or url in self._published}
            if values:
                written = await self.store.call(self._writing(values))
                self._unwritten = written is None
                if written is not None:
                    self._published = {url: v for url, v in values.items() if v}
            await asyncio.sleep(MIN_INTERVAL_S)  # changes that come meanwhile: one write

    async def aclose(self) -> None:
        if self._publishing is not None:
            self._publishing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._publishing
        if self._published:  # gone at once rather than at their expiry
            await self.store.call(self._writing(dict.fromkeys(self._published, "")))

    def _writing(self, values: Mapping[str, str]) -> Callable[[aioredis.Redis], Awaitable[object]]:
        """The write of `values` (each server's asks, "" for none) as one script call."""
        keys = [self._key(url) for url in values]
        args: list[str | int] = [self.name, int(TTL_S * 1000), *values.values()]

        async def write(_: aioredis.Redis) -> object:
            return await self._write(keys=keys, args=args)

        return write
