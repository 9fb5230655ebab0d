"""`make bench-model`: time to first audio and real-time factor of the model server.

Starts the real model server on a loopback port in this process (Kokoro-82M int8 onnx, or with
`--engine torch --model-dir DIR` kokoro's KModel on CUDA when there is one), or measures one at
`--url`, over the bidirectional WebSocket. Prints one table:

- short, medium and long sentences, one session: p50 time to first audio (send -> first PCM
  frame) and RTF (synthesis wall time / audio duration);
- 1, 2, 4 and 8 concurrent sessions each sending the medium sentence: p50 and p95 time to first
  audio, and the aggregate RTF (wall time / all audio produced).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
from websockets.asyncio.client import connect

from model_server.config import Settings

BIDI = "/invocations-bidirectional-stream"
TEXTS = {
    "short": "Hello there.",
    "medium": "The quick brown fox jumps over the lazy dog near the river bank.",
    "long": (
        "When the evening light fell across the valley, the travellers stopped to rest, "
        "counting the miles they had walked and the ones still ahead of them before dawn."
    ),
}


async def one_utterance(url: str, text: str, rid: str) -> tuple[float, float, float]:
    """(time to first audio, wall time, audio seconds) for one request on a fresh session."""
    async with connect(url + BIDI, max_size=None) as ws:
        started = time.perf_counter()
        await ws.send(orjson.dumps({"text": text, "request_id": rid}))
        first = None
        async for frame in ws:
            if isinstance(frame, bytes):
                first = first or time.perf_counter()
                continue
            event = orjson.loads(frame)
            if event["type"] == "synthesis_complete":
                done = time.perf_counter()
                assert first is not None
                return first - started, done - started, float(event["total_duration_s"])
            if event["type"] == "error":
                raise RuntimeError(event)
    raise RuntimeError("closed early")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(url: str, runs: int, levels: list[int]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    await one_utterance(url, TEXTS["short"], "warm")
    for name, text in TEXTS.items():
        results = [await one_utterance(url, text, f"{name}{i}") for i in range(runs)]
        ttfa = [r[0] for r in results]
        rtf = [r[1] / r[2] for r in results]
        audio = results[0][2]
        rows.append(
            (
                f"{name} ({audio:.1f} s audio)",
                "1",
                f"{statistics.median(ttfa) * 1000:.0f}",
                "",
                f"{statistics.median(rtf):.2f}",
            )
        )
    for n in levels:
        started = time.perf_counter()
        results = []
        for r in range(runs):
            batch = await asyncio.gather(
                *(one_utterance(url, TEXTS["medium"], f"c{n}-{r}-{i}") for i in range(n))
            )
            results.extend(batch)
        wall = time.perf_counter() - started
        ttfa = [x[0] for x in results]
        audio = sum(x[2] for x in results)
        rows.append(
            (
                "medium, concurrent",
                str(n),
                f"{pct(ttfa, 0.5) * 1000:.0f}",
                f"{pct(ttfa, 0.95) * 1000:.0f}",
                f"{wall / audio:.2f}",
            )
        )
    return rows


@contextmanager
def local_server(settings: Settings) -> Iterator[str]:
    from model_server.app import create_app
    from tests.support.servers import serve

    app = create_app(settings)
    with serve(app) as running:
        if not app.state.service.settled.wait(timeout=300) or not app.state.service.ready:
            raise SystemExit(f"model server failed: {app.state.service.failure}")
        yield running.ws_url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="measure a running model server (ws://host:port)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--engine", choices=["onnx", "torch"], default="onnx")
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=Settings().model_dir,
        help="torch: Kokoro checkpoint directory",
    )
    parser.add_argument("--model-repo", help="torch: Hugging Face repo id instead")
    parser.add_argument("--device", default="auto", help="torch: cuda, cuda:N, cpu or auto")
    parser.add_argument("--voice", help="default voice (torch checkpoints: e.g. af_heart)")
    args = parser.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]

    def table(url: str) -> None:
        rows = asyncio.run(run(url, args.runs, levels))
        header = ("case", "sessions", "TTFA p50 ms", "TTFA p95 ms", "RTF")
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        print(f"\nmodel server at {url}, {os.cpu_count()} cores, {args.runs} runs per row")
        for row in [header, tuple("-" * w for w in widths), *rows]:
            print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))

    if args.url:
        table(args.url)
    else:
        settings = Settings(
            workers=args.workers,
            threads=args.threads,
            engine=args.engine,
            model_dir=args.model_dir,
            model_repo=args.model_repo,
            device=args.device,
            **({"default_voice": args.voice} if args.voice else {}),
        )
        with local_server(settings) as url:
            print(
                f"local server: engine {args.engine}, {args.workers} workers, "
                f"threads {args.threads or 'auto'}"
            )
            table(url)


if __name__ == "__main__":
    main()
