"""`make bench-batch`: the model server with `--batch off` and `--batch on`, side by side.

For each setting (its own model server process, one after the other), N = 1, 2, 3 concurrent
streamed `POST /invocations` of the same two-sentence answer (12.3 s of audio in jm_kumo),
after one to warm up: the wall time until every stream ended, the audio seconds served per wall
second (the higher, the more conversations a machine carries), and `GET /load`'s `batch_curve`
(seconds per frame of a decoder step by batch size: which batch sizes formed). `--rounds R`
repeats the whole comparison, alternating, for its spread.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from bench.harness import stack

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


async def _run(flags: list[str], ns: list[int]) -> list[str]:
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
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", default="1,2,3", help="N values, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--model-args", default="", help="more model server flags, for both")
    args = parser.parse_args()
    ns = [int(n) for n in args.conversations.split(",")]
    extra = args.model_args.split()
    table = []
    for _ in range(args.rounds):
        for setting in ("off", "on"):
            table += asyncio.run(_run(["--batch", setting, *extra], ns))
    print("\nbench-batch: streamed POST /invocations of a two-sentence answer, N at once")
    print("\n".join(table))


if __name__ == "__main__":
    main()
