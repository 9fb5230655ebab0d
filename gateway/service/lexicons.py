"""Pronunciation lexicons on the gateway (`kokoro_contract.lexicon`): the deployment's
(`--lexicon-file`, on every reply) and each client's named ones (`PUT /v1/lexicons/{name}`). A
request's `lexicon` names one of its client's, whose entries go on top of the deployment's; the
reply keeps the version it started with (a later `PUT` makes a new `Lexicon`, never changes one),
so it is read one way from start to end.

A fleet (`--redis-url`) shares them: a lexicon saved through one gateway is read by every
other, each version numbered once for the fleet (`HINCRBY`), its entries kept under the
client's hash in Redis and cached by version here. While Redis does not answer, a gateway reads
and saves what it holds itself (what was saved through it, and what it has read), and writes
what was saved through it back when Redis answers again, unless a newer version is there."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import redis.asyncio as aioredis

from gateway.errors import BadRequest, GatewayError
from gateway.fleet.store import FAILURES, Store
from gateway.service.voices import SAVED_NAME
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.lexicon import MAX_ENTRIES, Lexicon, check_entries

log = logging.getLogger(__name__)


def load_file(path: Path) -> Lexicon:
    """The deployment's lexicon: a JSON object word -> "/IPA/" or alias text. `ValueError`
    naming what is wrong."""
    try:
        raw = orjson.loads(path.read_bytes())
        return Lexicon(path.stem, check_entries(raw), 1)
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ValueError(f"--lexicon-file {path}: {exc}") from None
    except InvalidRequest as exc:
        raise ValueError(f"--lexicon-file {path}: {exc.message}") from None


@dataclass
class _Held:
    """What this gateway holds of one client's lexicons: each by name, and the names saved
    through it (to write back to a Redis that lost them)."""

    lexicons: dict[str, Lexicon] = field(default_factory=dict)
    saved_here: set[str] = field(default_factory=set)


class Lexicons:
    """The deployment's lexicon and each client's, at most `per_client` lexicons a client and
    `total_entries` entries held by this gateway in all (anonymous clients are each address:
    without a bound, many addresses could fill memory); shared through `store` when given."""

    def __init__(
        self,
        deployment: Lexicon | None = None,
        store: Store | None = None,
        per_client: int = 20,
        total_entries: int = 20 * MAX_ENTRIES,
    ) -> None:
        self.deployment = deployment
        self.store = store
        self.per_client = per_client
        self.total_entries = total_entries
        self._held: dict[str, _Held] = {}
        self._tasks: set[asyncio.Task[None]] = set()  # write-backs nobody waits for
        if store is not None:
            store.on_rejoin.append(self._write_back)

    async def of(self, client: str) -> dict[str, Lexicon]:
        """The client's lexicons by name: the fleet's when Redis answers, else those held."""
        held = self._held.get(client, _Held())
        versions = await self._versions(client)
        if versions is None:
            return dict(held.lexicons)
        out = {}
        for name, version in versions.items():
            lexicon = await self._read(client, name, version)
            if lexicon is not None:
                out[name] = lexicon
        return out

    async def save(self, client: str, name: str, entries: object) -> Lexicon:
        """The client's lexicon `name`, new or its next version. `BadRequest`: `invalid_field`
        (the name), `invalid_lexicon`, `invalid_ipa`, `lexicon_too_large`, `too_many_lexicons`."""
        if not SAVED_NAME.fullmatch(name):
            raise BadRequest(
                "a lexicon's name: 1-40 characters of a-z, 0-9, '_' and '-', starting with a "
                "letter or digit",
                code="invalid_field",
            )
        try:
            checked = check_entries(entries)
        except InvalidRequest as exc:
            raise BadRequest(exc.message, code=exc.code) from None
        held = self._held.setdefault(client, _Held())
        versions = await self._versions(client)
        names = set(versions) if versions is not None else set(held.lexicons)
        if name not in names and len(names) >= self.per_client:
            raise BadRequest(
                f"this client has {len(names)} lexicons, the most it may keep; delete one",
                code="too_many_lexicons",
            )
        old = held.lexicons.get(name)
        self._forget_reads(len(checked))
        if self._entries() + len(checked) - (len(old.entries) if old else 0) > self.total_entries:
            raise BadRequest(
                "this gateway keeps as many lexicon entries as it may; delete a lexicon",
                code="too_many_lexicons",
            )
        version = await self._next_version(client, name)
        if version is None:  # Redis does not answer: numbered here, written back later
            version = old.version + 1 if old else 1
        lexicon = Lexicon(name, checked, version)
        held.lexicons[name] = lexicon
        held.saved_here.add(name)
        await self._write(client, lexicon)
        return lexicon

    async def delete(self, client: str, name: str) -> bool:
        """Whether the client had a lexicon of that name (it has none now, fleet-wide)."""
        held = self._held.get(client)
        here = held is not None and held.lexicons.pop(name, None) is not None
        if held is not None:
            held.saved_here.discard(name)
            if not held.lexicons:
                del self._held[client]
        gone = None
        if self.store is not None:
            versions, entries = self._keys(client)
            gone = await self.store.call(lambda r: _delete(r, versions, entries, name))
        return here or bool(gone)

    async def for_reply(self, client: str, name: str | None) -> Lexicon | None:
        """What a reply of `client` asking for lexicon `name` reads with: the deployment's,
        with that one on top. 400 `unknown_lexicon` for a name the client has none of."""
        own = None
        if name is not None:
            own = await self.get(client, name)
            if own is None:
                raise GatewayError(
                    f"no lexicon {name!r} for this client (PUT /v1/lexicons/{{name}} saves one)",
                    code="unknown_lexicon",
                    status=400,
                )
        if self.deployment is None:
            return own
        return self.deployment.merged(own)

    # --- inside ---------------------------------------------------------------------------

    def _keys(self, client: str) -> tuple[str, str]:
        assert self.store is not None
        return self.store.key("lexicon-versions", client), self.store.key("lexicons", client)

    def _entries(self) -> int:
        return sum(len(x.entries) for held in self._held.values() for x in held.lexicons.values())

    def _forget_reads(self, room: int) -> None:
        """Lexicons only read from Redis (not saved through this gateway) forgotten, while
        what is held leaves less than `room` entries under the bound: Redis has them."""
        for held in self._held.values():
            for name in [n for n in held.lexicons if n not in held.saved_here]:
                if self._entries() + room <= self.total_entries:
                    return
                del held.lexicons[name]

    async def get(self, client: str, name: str) -> Lexicon | None:
        """The client's lexicon `name`: the fleet's when Redis answers, else the one held."""
        held = self._held.get(client, _Held()).lexicons.get(name)
        if self.store is None:
            return held
        versions_key, _ = self._keys(client)
        version = await self.store.call(lambda r: r.hget(versions_key, name))
        if version is None:  # none in the fleet, or Redis does not answer
            return held if not self.store.up else None
        return await self._read(client, name, int(version))

    async def _versions(self, client: str) -> dict[str, int] | None:
        if self.store is None:
            return None
        versions_key, _ = self._keys(client)
        raw = await self.store.call(lambda r: r.hgetall(versions_key))
        return None if raw is None else {str(k): int(v) for k, v in raw.items()}

    async def _read(self, client: str, name: str, version: int) -> Lexicon | None:
        """Version `version` of a lexicon: the one held when it is that one, else Redis's."""
        held = self._held.setdefault(client, _Held())
        cached = held.lexicons.get(name)
        if cached is not None and cached.version == version:
            return cached
        assert self.store is not None
        _, entries_key = self._keys(client)
        raw = await self.store.call(lambda r: r.hget(entries_key, name))
        if raw is None:
            return cached
        stored = orjson.loads(raw)
        lexicon = Lexicon(name, stored["entries"], int(stored["version"]))
        held.lexicons[name] = lexicon  # read: held, not written back
        return lexicon

    async def _next_version(self, client: str, name: str) -> int | None:
        if self.store is None:
            return None
        versions_key, _ = self._keys(client)
        answer = await self.store.call(lambda r: r.hincrby(versions_key, name, 1))
        return None if answer is None else int(answer)

    async def _write(self, client: str, lexicon: Lexicon) -> None:
        if self.store is None:
            return
        versions_key, entries_key = self._keys(client)
        body = orjson.dumps({"version": lexicon.version, "entries": dict(lexicon.entries)})
        await self.store.call(
            lambda r: _put(r, versions_key, entries_key, lexicon.name, lexicon.version, body)
        )

    async def _write_back(self, redis: aioredis.Redis) -> None:
        """Redis answers again: what was saved through this gateway is written back, where
        Redis has no newer, beside the rejoin (a large lexicon may take longer than one call's
        deadline, which the rejoin itself keeps), each write with its own deadline."""
        task = asyncio.create_task(self._writing_back(redis), name="lexicons-write-back")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _writing_back(self, redis: aioredis.Redis) -> None:
        assert self.store is not None
        # a copy: saves and deletes may come while each write waits
        for client, held in list(self._held.items()):
            versions_key, entries_key = self._keys(client)
            for name in list(held.saved_here):
                lexicon = held.lexicons.get(name)
                if lexicon is None:
                    continue
                body = orjson.dumps({"version": lexicon.version, "entries": dict(lexicon.entries)})
                try:
                    async with asyncio.timeout(max(self.store.timeout_s, 5.0)):
                        await _put(redis, versions_key, entries_key, name, lexicon.version, body)
                except FAILURES as exc:  # its type only: a message may name the host
                    log.warning(
                        "fleet: lexicons saved here while Redis was away not all written back "
                        "(%s); each is again when next saved",
                        type(exc).__name__,
                    )
                    return


_PUT = """
local stored = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if stored > tonumber(ARGV[2]) then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""


async def _put(
    redis: aioredis.Redis, versions: str, entries: str, name: str, version: int, body: bytes
) -> object:
    """A lexicon's version written, unless a newer one is there (two gateways saving at once,
    or one writing back what it saved while Redis was gone)."""
    return await redis.eval(_PUT, 2, versions, entries, name, version, body)


async def _delete(redis: aioredis.Redis, versions: str, entries: str, name: str) -> int:
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hdel(versions, name)
        pipe.hdel(entries, name)
        removed = await pipe.execute()
    return int(removed[0])
