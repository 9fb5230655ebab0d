"""The limits a fleet shares (`gateway.fleet.limits`) and its store's health
(`gateway.fleet.store`), over a real `redis-server` on loopback: two stores stand for two
gateways."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from gateway.fleet.limits import Full, SharedLimits, Used, Window
from gateway.fleet.store import Store
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import free_port


@pytest.fixture
def redis_db() -> Iterator[RedisServer]:
    with redis_server() as server:
        yield server


async def store_on(server: RedisServer, **options: float) -> Store:
    store = Store(server.url, prefix="test", timeout_s=1.0, **options)
    await store.start()
    return store


def limits_on(store: Store, ttl_s: float = 30.0, **limits: int) -> SharedLimits:
    caps = {"max_fleet_sessions": 0, "max_per_client": 2, "max_per_subject": 1, **limits}
    return SharedLimits(store, lease_ttl_s=ttl_s, **caps)


async def eventually(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    """Polled: a lease's expiry and a store's probe are timed in another process or by the
    clock, with no event to wait on."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        await asyncio.sleep(0.02)


@pytest.fixture
async def two(redis_db: RedisServer) -> AsyncIterator[tuple[SharedLimits, SharedLimits]]:
    a, b = await store_on(redis_db), await store_on(redis_db)
    yield limits_on(a), limits_on(b)
    await a.aclose()
    await b.aclose()


async def test_a_clients_sessions_are_counted_across_gateways(
    two: tuple[SharedLimits, SharedLimits], redis_db: RedisServer
) -> None:
    a, b = two
    first, full = await a.open_session("alice", None)
    assert full is None
    assert (await b.open_session("alice", None))[1] is None
    assert (await a.open_session("alice", None))[1] == Full("client", 2)
    assert (await b.open_session("alice", None))[1] == Full("client", 2)
    assert (await b.open_session("bob", None))[1] is None  # another client's own
    # a token's visitor within alice's key (its own key's share counted too)
    assert (await a.open_session("carol", "carol v1"))[1] is None
    assert (await b.open_session("carol", "carol v1"))[1] == Full("subject", 1)
    a.close_session(first)
    await a.settled()
    assert (await b.open_session("alice", None))[1] is None
    members = redis_db.client().zrange("{test}:sessions:client:alice", 0, -1)
    assert first not in members
    assert len(members) == 2


async def test_the_fleets_cap_counts_every_client(redis_db: RedisServer) -> None:
    store = await store_on(redis_db)
    limits = limits_on(store, max_fleet_sessions=3)
    answers = [(await limits.open_session(name, None))[1] for name in ("a", "b", "c", "d")]
    assert answers == [None, None, None, Full("fleet", 3)]
    await store.aclose()


async def test_a_dead_gateways_leases_expire_and_a_live_ones_are_renewed(
    redis_db: RedisServer,
) -> None:
    """The dead one never renews (no heartbeat started); the live one renews every third of
    the TTL, so its lease outlives many TTLs."""
    dead = limits_on(await store_on(redis_db), ttl_s=0.3)
    live = limits_on(await store_on(redis_db), ttl_s=0.3)
    await live.start()
    assert (await dead.open_session("alice", None))[1] is None
    assert (await live.open_session("alice", None))[1] is None
    assert (await live.open_session("alice", None))[1] == Full("client", 2)
    renewed = live.store.round_trips
    await eventually(lambda: live.store.round_trips >= renewed + 10)  # 10 heartbeats: 1 s
    assert (await live.open_session("alice", None))[1] is None  # the dead one's place
    assert (await live.open_session("alice", None))[1] == Full("client", 2)  # its own held
    await live.aclose()
    await dead.store.aclose()
    await live.store.aclose()


async def test_a_window_sums_its_charges_across_gateways(
    two: tuple[SharedLimits, SharedLimits],
) -> None:
    a, b = two
    tokens = "LLM-tokens:client:alice"
    replies = "replies:client:alice"
    assert await a.charge([Window(replies, 2, 1), Window(tokens, 1000, 0)]) is None
    b.charge_later([Window(tokens, 0, 700)])  # an answer's tokens, at its end
    await b.settled()
    assert await b.charge([Window(replies, 2, 1), Window(tokens, 1000, 0)]) is None
    a.charge_later([Window(tokens, 0, 400)])
    await a.settled()
    used = await a.charge([Window(replies, 5, 1), Window(tokens, 1000, 0)])
    assert isinstance(used, Used)
    assert (used.index, used.used) == (1, 1100)
    assert 55 < used.wait_s <= 60  # the first charge leaves the window a minute after it
    # refused: nothing charged (the replies window still holds the two replies)
    refused = await b.charge([Window(replies, 2, 1)])
    assert refused is not None
    assert (refused.index, refused.used) == (0, 2)


async def test_a_store_that_stops_answering_degrades_and_rejoins_with_its_leases(
    redis_db: RedisServer,
) -> None:
    """Redis stopped: calls answer None at once (each gateway counts alone), the state is
    told once; started again, empty: the probe rejoins and writes the live leases back."""
    store = await store_on(redis_db, probe_s=0.05)
    changes: list[bool] = []
    store.on_change.append(changes.append)
    limits = limits_on(store)
    held, _ = await limits.open_session("alice", None)
    redis_db.stop()
    assert (await limits.open_session("alice", None))[1] is None  # counted nowhere but here
    assert (store.up, store.reason) == (False, "Redis unreachable (ConnectionError)")
    assert await limits.charge([Window("replies:client:alice", 1, 1)]) is None
    assert limits.live == 2  # both written when it answers
    redis_db.start()  # same port, nothing kept
    await eventually(lambda: store.up)
    assert changes == [False, True]
    assert len(redis_db.client().zrange("{test}:sessions:client:alice", 0, -1)) == 2
    assert (await limits.open_session("alice", None))[1] == Full("client", 2)
    limits.close_session(held)
    await limits.settled()
    assert len(redis_db.client().zrange("{test}:sessions:client:alice", 0, -1)) == 1
    await store.aclose()


async def test_a_frozen_store_costs_a_call_its_deadline_not_a_hang(redis_db: RedisServer) -> None:
    store = Store(redis_db.url, prefix="test", timeout_s=0.2, probe_s=0.05)
    await store.start()
    limits = limits_on(store)
    redis_db.freeze()
    try:
        assert (await limits.open_session("alice", None))[1] is None
        assert (store.up, store.reason) == (False, "Redis did not answer in time")
    finally:
        redis_db.thaw()
    await eventually(lambda: store.up)
    await store.aclose()


def test_a_url_that_is_not_redis_is_one_clear_error_without_its_secret() -> None:
    for url in ("http://user:s3cret@example.com", "redis://:s3cret@host:port/0"):
        with pytest.raises(ValueError, match="--redis-url is not a Redis URL") as bad:
            Store(url, prefix="test", timeout_s=0.25)
        assert "s3cret" not in str(bad.value)


async def test_a_store_that_refuses_writes_degrades_and_says_so(redis_db: RedisServer) -> None:
    """Redis made a read-only replica (a failover that left the gateways on the old primary):
    its writes refused, counted as down with that reason, and back once it takes writes."""
    store = await store_on(redis_db, probe_s=0.05)
    limits = limits_on(store)
    admin = redis_db.client()
    admin.replicaof("127.0.0.1", str(free_port()))  # a primary that is not there: read-only
    assert (await limits.open_session("alice", None))[1] is None  # served, counted here
    assert not store.up
    assert store.reason == "Redis refused a call (ReadOnlyError)"
    admin.replicaof("NO", "ONE")
    await eventually(lambda: store.up)  # the probe's rejoin writes the lease it holds
    assert len(admin.zrange("{test}:sessions:client:alice", 0, -1)) == 1
    await store.aclose()
