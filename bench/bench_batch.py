"""`make bench-batch`: the model server with `--batch off` and `--batch on`, side by side.

For each setting (its own model server process, one after the other), N = 1, 2, 3 concurrent
streamed `POST /invocations` of the same two-sentence answer (12.3 s of audio in jm_kumo),
after one to warm up: the wall time until every stream ended, the audio seconds served per wall
second (the higher, the more conversations a machine carries), and `GET /load`'s `batch_curve`
(seconds per frame of a decoder step by batch size: which batch sizes formed). `--rounds R`
repeats the whole comparison, alternating, for its spread.

`--curve-out FILE` keeps what was measured as a curve for `bench.sim_engine` (`make bench-load
BENCH_ARGS="--simulate-gpu --curve FILE"`): the speeds `--batch off` learned (a call alone, and
how much slower two side by side are), the batch curve `--batch on` learned, and where they
were measured (`--curve-source`, with the engine's own description and the date).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import shlex
import time
from pathlib import Path
from typing import Any

import httpx

from bench.harness import stack
from kokoro_contract.load import SEGMENT_PHONEMES

ANSWER = (
    "Your order shipped this morning and arrives on Friday, so you can track it online any "
    "time you like. I can help you change your flight to a later time, or book a new one for "
    "tomorrow morning instead."
)


async def _stream(http: httpx.AsyncClient, base: str) -> int:
    """One streamed invocation: the PCM bytes it gave."""
    got = 0
    body = {"text": ANSWER, "stream": True}
    async with http.stream("POST", f"{base}/invocations", json=body, timeout=300) as response:
        response.raise_for_status()
        async for chunk in response.aiter_bytes():
            got += len(chunk)
    return got


async def _run(flags: list[str], ns: list[int]) -> tuple[list[str], dict[str, Any]]:
    """Each N's line, and the model server's `/load` (and `/ping`'s engine) after them all."""
    lines = []
    with stack(flags, []) as urls:
        async with httpx.AsyncClient() as http:
            await _stream(http, urls.model_server)  # warm up
            for n in ns:
                started = time.perf_counter()
                sizes = await asyncio.gather(*(_stream(http, urls.model_server) for _ in range(n)))
                wall = time.perf_counter() - started
                curve = (await http.get(f"{urls.model_server}/load")).json().get("batch_curve")
                audio = sum(sizes) / 2 / 24_000
                lines.append(
                    f"  {' '.join(flags):<11} N={n}  wall {wall:6.2f} s  audio {audio:5.1f} s  "
                    f"audio s per wall s {audio / wall:5.2f}  batch_curve {curve}"
                )
                print(lines[-1], flush=True)
            load = (await http.get(f"{urls.model_server}/load")).json()
            load["engine"] = (await http.get(f"{urls.model_server}/ping")).json().get("engine")
    return lines, load


def curve(off: dict[str, Any], on: dict[str, Any], source: str) -> dict[str, Any]:
    """A curve file for `bench.sim_engine` from the `/load` of `--batch off` and of `on`."""
    a, b = off["seconds_per_call"], off["seconds_per_phoneme"]
    shared_a, shared_b = off.get("shared_seconds_per_call"), off.get("shared_seconds_per_phoneme")
    beside = 0.0
    if shared_a is not None and shared_b is not None and off["workers"] > 1:
        alone = a + b * SEGMENT_PHONEMES
        beside = max(0.0, (shared_a + shared_b * SEGMENT_PHONEMES) / alone - 1)
    date = datetime.date.today().isoformat()
    return {
        "source": f"{source}: {off.get('engine')}, {off['workers']} workers, {date} "
        "(bench/bench_batch.py --curve-out)",
        "seconds_per_call": a,
        "seconds_per_phoneme": b,
        "beside": round(beside, 4),
        "batch_curve": on.get("batch_curve"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", default="1,2,3", help="N values, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-args", default="", help="more model server flags, for both")
    parser.add_argument("--curve-out", type=Path, help="the measured curve, for bench.sim_engine")
    parser.add_argument("--curve-source", default="this machine", help="where it was measured")
    args = parser.parse_args()
    ns = [int(n) for n in args.conversations.split(",")]
    extra = shlex.split(args.model_args)
    table = []
    loads: dict[str, dict[str, Any]] = {}
    for _ in range(args.rounds):
        for setting in ("off", "on"):
            lines, loads[setting] = asyncio.run(_run(["--batch", setting, *extra], ns))
            table += lines
    print("\nbench-batch: streamed POST /invocations of a two-sentence answer, N at once")
    print("\n".join(table))
    if args.curve_out is not None:
        measured = curve(loads["off"], loads["on"], args.curve_source)
        args.curve_out.write_text(json.dumps(measured, indent=2) + "\n")
        print(f"the curve: {args.curve_out} ({measured['source']})")


if __name__ == "__main__":
    main()
