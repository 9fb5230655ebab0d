"""Two gateways in front of one model server, with and without the Redis they share
(`--redis-url`), beside one gateway alone (make bench-fleet).

Starts Debian's `redis-server` on a loopback port, a real model server (Kokoro-82M int8 on
onnxruntime) and its gateways (`bench.harness.stack`), then, side by side in one run:

1. **Load** (`make bench-load`'s conversations, its paced answer, its listener): N = 1..3
   conversations on one gateway; split over two gateways that count alone; split over two
   gateways sharing Redis. Asked, served, refused, first audio, replies with a gap: the fleet
   should refuse and stutter as one gateway does, where two counting alone admit twice.
2. **Limits**: `--attempts` WebSocket sessions of one client (its cap: 8) opened at once,
   spread over both gateways, each held until all were tried: how many the cap let through,
   counting alone and sharing.
3. **Redis frozen** (SIGSTOP) under a gateway: a short reply's first audio while it answers,
   and the first and second reply after it froze: the call that finds it gone costs at most
   `--redis-timeout-s`, and the replies after it nothing.
4. **What the store costs**: Redis round trips per reply (the gateways' own count,
   `gateway_fleet_round_trip_seconds`, over the load's replies) and each call's time measured
   here directly, `--calls` times each on the same Redis (p50, p99): a session opened and
   closed, a reply's rates, admission's read.

    .venv/bin/python -m bench.bench_fleet [--conversations 1,2,3] [--replies 4] [--attempts 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from bench.bench_gateway import engine_seconds
from bench.bench_load import Row, clients_apart, describe, load
from bench.harness import stack
from gateway.fleet.asks import FleetAsks
from gateway.fleet.limits import SharedLimits, Window
from gateway.fleet.store import Store
from kokoro_contract.asks import Ask
from tests.support.redis_server import RedisServer, redis_server
from tests.support.servers import free_port

CAP = 8  # a client's sessions at once (the gateway's default --max-sessions-per-client)


async def metric_sum(internals: Sequence[str], name: str) -> float:
    """A metric's value summed over the gateways' /metrics."""
    total = 0.0
    async with httpx.AsyncClient(timeout=10) as http:
        for url in internals:
            for line in (await http.get(url + "/metrics")).text.splitlines():
                if line.startswith(name + " "):
                    total += float(line.split()[1])
    return total


async def sessions_let_through(bases: Sequence[str], attempts: int) -> tuple[int, dict[int, int]]:
    """`attempts` WebSocket sessions of one client opened at once over `bases`, each held
    until all were tried: how many opened, and the refusals by status."""
    opened: list[ClientConnection] = []
    refused: dict[int, int] = {}

    async def attempt(i: int) -> None:
        ws_url = bases[i % len(bases)].replace("http://", "ws://") + "/v1/speak/ws"
        try:
            opened.append(await connect(ws_url))
        except InvalidStatus as exc:
            status = exc.response.status_code
            refused[status] = refused.get(status, 0) + 1

    await asyncio.gather(*(attempt(i) for i in range(attempts)))
    count = len(opened)
    await asyncio.gather(*(ws.close() for ws in opened))
    return count, refused


async def reply_times(base: str) -> tuple[float, float]:
    """A short reply's start (`audio_stream_start`: admitted, its session, rates and admission
    done) and its first audio, from its request, in seconds."""
    async with httpx.AsyncClient(base_url=base, timeout=60) as http:
        start = time.perf_counter()
        started = None
        body = {"text": "Hello there.", "format": "pcm"}
        async with http.stream("POST", "/v1/speak", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line == "event: audio_stream_start":
                    started = time.perf_counter() - start
                if line == "event: audio_chunk" and started is not None:
                    return started, time.perf_counter() - start
    raise RuntimeError("no audio")


def frozen_first_audio(redis: RedisServer, base: str) -> None:
    """A short reply's start and first audio while Redis answers, then the first and second
    replies after it froze (SIGSTOP): the call that finds it gone costs at most the store's
    deadline, the replies after it nothing (the gateway counts alone until it answers again)."""
    print("\nRedis frozen under a gateway: a short reply's start / first audio", flush=True)
    for state in ("answering", "answering", "frozen", "frozen, again"):
        if state == "frozen":
            redis.freeze()
        started, first = asyncio.run(reply_times(base))
        print(f"  {state:<14} {started * 1000:6.0f} / {first * 1000:6.0f} ms", flush=True)
    redis.thaw()


async def timed(calls: int, call: Callable[[], Awaitable[object]]) -> tuple[float, float]:
    """p50 and p99 of `call`, in ms, over `calls` tries after 20 not counted."""
    for _ in range(20):
        await call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        await call()
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, round(0.99 * (len(times) - 1)))]


async def store_costs(redis_url: str, calls: int) -> dict[str, tuple[float, float]]:
    store = Store(redis_url, prefix="bench-costs", timeout_s=1.0)
    await store.start()
    limits = SharedLimits(
        store, lease_ttl_s=15, max_fleet_sessions=0, max_per_client=10**6, max_per_subject=0
    )
    asks = FleetAsks(store)
    urls = ["http://127.0.0.1:8080"]
    windows = [
        Window("replies:client:bench", 10**9, 1),
        Window("LLM-tokens:client:bench", 10**9, 0),
    ]

    async def session() -> None:
        lease, _ = await limits.open_session("bench", None)
        limits.close_session(lease)
        await limits.settled()

    async def rates() -> None:
        await limits.charge(windows)

    async def admission_read() -> None:
        await asks.others(urls)

    await store.call(lambda r: r.hset(store.key("asks", urls[0]), "other", f"{2**50}|[null]"))
    costs = {
        "a session opened and closed (2 round trips)": await timed(calls, session),
        "a reply's rates, checked and charged": await timed(calls, rates),
        "admission's read of the other gateways' asks": await timed(calls, admission_read),
    }
    assert await asks.others(urls) == {urls[0]: (Ask(),)}
    await store.aclose()
    return costs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", default="1,2,3", help="N values, comma-separated")
    parser.add_argument("--replies", type=int, default=4, help="replies per conversation")
    parser.add_argument("--limit-s", type=float, default=120, help="longest run of one N")
    parser.add_argument("--attempts", type=int, default=200)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-load", action="store_true", help="limits, faults, costs only")
    args = parser.parse_args()
    ns = [int(n) for n in args.conversations.split(",")]
    # the load's conversations are clients apart (their caps do not refuse them); the limits
    # section asks as one client with the default cap
    load_flags = clients_apart(max(ns))
    rows: dict[str, list[Row]] = {}
    with redis_server() as redis:
        fleet_env = {"GATEWAY_REDIS_URL": redis.url}
        setups = {
            "one gateway": ({}, 1),
            "two, alone": ({}, 2),
            "two, Redis": (fleet_env, 2),
        }
        round_trips: dict[str, float] = {}
        for name, (env, count) in setups.items():
            if args.skip_load:
                break
            with stack(
                [], load_flags, gateways=count, gateway_env=env, internal_port=free_port()
            ) as s:
                asyncio.run(load(s.gateways[:1], 1, 1, args.seed, "bidi", 60))  # warm up
                before = asyncio.run(
                    metric_sum(s.internals, "gateway_fleet_round_trip_seconds_count")
                )
                rows[name] = []
                for n in ns:
                    engine_before = engine_seconds(s.model_server)
                    row = asyncio.run(
                        load(s.gateways, n, args.replies, args.seed, "bidi", args.limit_s)
                    )
                    row.engine_s = engine_seconds(s.model_server) - engine_before
                    rows[name].append(row)
                    print(describe(name, row), flush=True)
                after = asyncio.run(
                    metric_sum(s.internals, "gateway_fleet_round_trip_seconds_count")
                )
                asked = sum(len(r.replies) for r in rows[name])
                if env:
                    round_trips[name] = (after - before) / max(1, asked)
        print(
            "\nLimits: one client's sessions (cap 8), opened at once over the gateways", flush=True
        )
        for name, env in (("two, alone", {}), ("two, Redis", fleet_env)):
            with stack([], [], gateways=2, gateway_env=env) as s:
                opened, refused = asyncio.run(sessions_let_through(s.gateways, args.attempts))
                print(
                    f"  {name:<11} {args.attempts} attempts: {opened} opened "
                    f"({max(0, opened - CAP)} over the cap), refused {refused}",
                    flush=True,
                )
                if env:
                    frozen_first_audio(redis, s.gateways[0])
        print("\nThe store's cost", flush=True)
        for name, per_reply in round_trips.items():
            print(
                f"  {name}: {per_reply:.1f} Redis round trips per reply asked (all gateways, "
                "heartbeats and asks' writes included)",
                flush=True,
            )
        for what, (p50, p99) in asyncio.run(store_costs(redis.url, args.calls)).items():
            print(f"  {what}: p50 {p50:.3f} ms, p99 {p99:.3f} ms", flush=True)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
