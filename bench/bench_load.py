"""`make bench-load`: simulated conversations through the gateway, N = 1, 2, 3, 4 at once.

Each conversation asks (the demo's 5-sentence answer, echo source paced like an LLM: 40
tokens/s, first token at 300 ms, `format=pcm` over SSE), hears the whole reply, thinks 1-3 s
(seeded), and asks again; a refused ask is asked again after its Retry-After (each ask counts,
up to `--replies` per conversation). A listener starts playing at the first audio chunk; a gap
is any moment the audio received so far has run out before the next chunk arrives (gaps under
10 ms, the event loop's own jitter, are not counted). A reply refused up front (503
`overloaded`) counts as refused, not served.

Each policy runs its own model server and gateway (separate processes, as deployed) with its
flags, one policy after the other on the same machine: `today` is the scheduling before the
real-time work (round-robin scheduler, 2 workers x all cores each, sentence-sized chunks with
no deadlines, nothing refused), `realtime` the current defaults (earliest deadline first, a
call beside another on its share of the cores, the playback-aware chunk plan, admission
control). Prints one table per policy and N, and a PNG plot of
first-audio p95 and gap seconds against N for both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shlex
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.bench_gateway import ANSWER, FIRST_MS, TPS, engine_seconds
from bench.harness import ReplyResult, cpu_seconds, one_reply
from bench.harness import stack as stack  # bench_quality takes it from here
from bench.sim_engine import DEFAULT_CURVE, Curve

POLICIES: dict[str, tuple[list[str], list[str]]] = {
    # (model server flags, gateway flags)
    "today": (
        ["--scheduling", "fair", "--workers", "2", "--threads", str(os.cpu_count() or 1)],
        ["--chunk-plan", "sentences", "--admission", "false", "--first-max-words", "8"],
    ),
    "realtime": ([], []),
    # the current defaults with the decoder's steps of several segments batched (`--batch on`)
    "batched": (["--batch", "on"], []),
}


def clients_apart(conversations: int) -> list[str]:
    """Every conversation comes from this one address, but stands for a client of its own:
    the per-client limits (8 sessions, 60 replies a minute, one reply waiting for spare time)
    must not refuse them."""
    return [
        "--max-sessions-per-client",
        str(max(8, conversations)),
        "--replies-per-minute",
        "0",
        "--admission-waiting-per-client",
        "0",
    ]


@dataclass
class Row:
    n: int
    replies: list[ReplyResult] = field(default_factory=list)
    engine_s: float = 0.0  # the model server's engine time while this N ran
    cpu_s: float = 0.0  # the model server process's CPU time while this N ran

    @property
    def cpu_per_audio_s(self) -> float:
        """The model server's CPU seconds per second of audio it served: the compute a
        conversation costs, whatever the calls' wall time (batched or not)."""
        audio = sum(r.audio_s for r in self.served)
        return self.cpu_s / audio if audio else float("nan")

    @property
    def engine_per_reply(self) -> float:
        """Engine seconds per served reply (at N = 1: each reply's own synthesis time)."""
        return self.engine_s / len(self.served) if self.served else float("nan")

    @property
    def served(self) -> list[ReplyResult]:
        return [r for r in self.replies if not r.refused and r.error is None]

    def first_audio(self, q: float) -> float:
        values = sorted(r.first_audio_s for r in self.served if r.first_audio_s is not None)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(q * (len(values) - 1)))]


async def conversation(
    base: str, replies: int, rng: random.Random, row: Row, mode: str, stop_at: float
) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=300) as http:
        await asyncio.sleep(rng.uniform(0, 2))  # conversations do not all start at once
        for _ in range(replies):
            if time.perf_counter() > stop_at:
                return
            started = time.perf_counter()
            result = await one_reply(http, mode)
            row.replies.append(result)
            if result.refused:  # the client asks again when told to (each ask counts)
                await asyncio.sleep(result.retry_after_s + rng.uniform(0, 1))
                continue
            # hear the whole reply, then think
            listened = max(0.0, started + result.play_end_s - time.perf_counter())
            await asyncio.sleep(listened + rng.uniform(1.0, 3.0))


def one_batch_s(model_url: str) -> float:
    """Engine seconds for the whole answer in one engine call (a request with a deadline is
    packed into as few calls as Kokoro's limit allows: one, for this answer); best of 2."""
    times = []
    for _ in range(2):
        before = engine_seconds(model_url)
        body = {"text": ANSWER, "deadline_ms": 60_000}
        httpx.post(f"{model_url}/invocations", json=body, timeout=120).raise_for_status()
        times.append(engine_seconds(model_url) - before)
    return min(times)


async def load(
    bases: Sequence[str], n: int, replies: int, seed: int, mode: str, limit_s: float
) -> Row:
    """`n` conversations at once, the i-th on gateway `bases[i % len(bases)]`."""
    row = Row(n)
    rng = random.Random(seed * 1000 + n)
    stop_at = time.perf_counter() + limit_s
    await asyncio.gather(
        *(
            conversation(
                bases[i % len(bases)], replies, random.Random(rng.random()), row, mode, stop_at
            )
            for i in range(n)
        )
    )
    return row


def describe(policy: str, row: Row) -> str:
    served = row.served
    gapped = [r for r in served if r.gap_s > 0]
    gap_mean = statistics.mean([r.gap_s for r in served]) if served else float("nan")
    errors = sum(1 for r in row.replies if r.error is not None)
    return (
        f"  {policy:<9} N={row.n}  asked {len(row.replies):>3}  served {len(served):>3}  "
        f"refused {sum(r.refused for r in row.replies):>3}  errors {errors:>2}  "
        f"first audio p50 {row.first_audio(0.5):5.2f} s  p95 {row.first_audio(0.95):5.2f} s  "
        f"with a gap {len(gapped):>3}/{len(served):<3}  gap s/reply {gap_mean:5.2f}  "
        f"engine s/reply {row.engine_per_reply:5.2f}  cpu s/audio s {row.cpu_per_audio_s:4.2f}"
    )


def plot(rows: dict[str, list[Row]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for policy, policy_rows in rows.items():
        ns = [r.n for r in policy_rows]
        ax1.plot(ns, [r.first_audio(0.95) for r in policy_rows], marker="o", label=policy)
        gaps = [
            statistics.mean([x.gap_s for x in r.served]) if r.served else 0 for r in policy_rows
        ]
        ax2.plot(ns, gaps, marker="o", label=policy)
    ax1.set(xlabel="conversations at once", ylabel="first audio p95 (s)", title="First audio")
    ax2.set(xlabel="conversations at once", ylabel="gap seconds per served reply", title="Gaps")
    for ax in (ax1, ax2):
        ax.set_xticks(sorted({r.n for rs in rows.values() for r in rs}))
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", default="1,2,3,4", help="N values, comma-separated")
    parser.add_argument("--replies", type=int, default=4, help="replies per conversation")
    parser.add_argument("--limit-s", type=float, default=120, help="longest run of one N")
    parser.add_argument("--policies", default="today,realtime")
    parser.add_argument("--mode", default="bidi")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--model-args", default="", help="more model server flags, for every policy (a GPU box)"
    )
    parser.add_argument("--gateway-args", default="", help="more gateway flags, for every policy")
    parser.add_argument(
        "--simulate-gpu",
        action="store_true",
        help="engine calls take a GPU's measured time (bench/sim_engine.py): a GPU's scale",
    )
    parser.add_argument(
        "--curve",
        type=Path,
        default=DEFAULT_CURVE,
        help="with --simulate-gpu: a measured curve (bench_batch --curve-out), default the H200's",
    )
    parser.add_argument("--plot", type=Path, default=Path("docs/bench-load.png"))
    parser.add_argument(
        "--timelines",
        action="store_true",
        help="print each served reply's chunks and arrivals, and each refusal's reason",
    )
    args = parser.parse_args()
    ns = [int(n) for n in args.conversations.split(",")]
    model_command = None
    if args.simulate_gpu:
        model_command = [sys.executable, "-m", "bench.sim_engine", "--curve", str(args.curve)]
        print(f"simulated engine, its curve measured on {Curve.load(args.curve).source}")
    results: dict[str, list[Row]] = {}
    batches: dict[str, float] = {}
    for policy in args.policies.split(","):
        model_flags, gateway_flags = POLICIES[policy]
        gateway_flags = [*gateway_flags, *clients_apart(max(ns)), *shlex.split(args.gateway_args)]
        model_flags = [*model_flags, *shlex.split(args.model_args)]
        with stack(model_flags, gateway_flags, model_command=model_command) as urls:
            base = urls.gateway
            asyncio.run(load([base], 1, 1, args.seed, args.mode, 60))  # warm up
            batches[policy] = one_batch_s(urls.model_server)
            print(
                f"  {policy:<9} one batch (the whole answer, one engine call): "
                f"{batches[policy]:.2f} s",
                flush=True,
            )
            results[policy] = []
            for n in ns:
                before, cpu = engine_seconds(urls.model_server), cpu_seconds(urls.procs[0])
                row = asyncio.run(load([base], n, args.replies, args.seed, args.mode, args.limit_s))
                row.engine_s = engine_seconds(urls.model_server) - before
                row.cpu_s = cpu_seconds(urls.procs[0]) - cpu
                results[policy].append(row)
                print(describe(policy, row), flush=True)
                if args.timelines:
                    for reply in row.served:
                        print(f"    first {reply.first_audio_s:.2f} s  {reply.timeline()}")
                    for reply in row.replies:
                        if reply.refused:
                            print(
                                f"    refused after {reply.refused_after_s:.2f} s: {reply.message}"
                            )
    print(
        f"\nbench-load: {len(ANSWER)}-char answer at {TPS:.0f} tokens/s "
        f"(first at {FIRST_MS:.0f} ms), "
        f"pcm over SSE, {args.replies} replies per conversation, think 1-3 s, seed {args.seed}"
    )
    for n_index in range(len(ns)):
        for policy, rows in results.items():
            print(describe(policy, rows[n_index]))
    for policy, rows in results.items():
        alone = [r for r in rows if r.n == 1]
        if alone:
            ratio = alone[0].engine_per_reply / batches[policy]
            print(
                f"  {policy:<9} N=1: engine {alone[0].engine_per_reply:.2f} s per reply, "
                f"one batch {batches[policy]:.2f} s: {ratio:.2f}x"
            )
    plot(results, args.plot)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
