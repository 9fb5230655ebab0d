"""`make bench-model`: time to first audio and real-time factor of the model server.

Starts the real model server on a loopback port in this process (Kokoro-82M int8 onnx, or with
`--engine torch --model-dir DIR` kokoro's KModel on CUDA when there is one), or measures one at
`--url`, over the bidirectional WebSocket. Prints two tables:

- progressive synthesis (local servers only): for sentences of 1 to 11 s of audio, one
  session, the first and the last audio (send -> first / last PCM frame) of a server with
  `--progressive on` (onnx: with each decoder, `--decoder stream` and `--decoder windows`) and
  of one with `--progressive off`, side by side in one run beside one raw
  call of the whole sentence (onnx: one onnxruntime call of the registry's graph, the same
  threads; torch: one call of the engine outside the server, KModel's forward on the same
  device and checkpoint; the same phonemes and voice), in turn, the order rotating from run to
  run; medians, each ratio to the raw call as the median of the runs' ratios with their range;
- the server (progressive as configured): short, medium and long sentences, one session: p50
  time to first audio and RTF (synthesis wall time / audio duration); then 1, 2, 4 and 8
  concurrent sessions each sending the medium sentence: p50 and p95 time to first audio, and
  the aggregate RTF (wall time / all audio produced).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

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


# sentences for the progressive table, by length (jm_kumo: about 1.2, 3.6, 9.5 and 11 s)
BY_LENGTH = {
    "Hello there.": TEXTS["short"],
    "medium": TEXTS["medium"],
    "long": TEXTS["long"],
    "~11 s": (
        "If you would like to change your delivery address, open the account page, choose "
        "the orders tab, and pick the parcel you want to move before it leaves the depot."
    ),
}


async def first_and_last(url: str, text: str, rid: str) -> tuple[float, float, float]:
    """(first audio, last audio, audio seconds) for one request on a fresh session."""
    async with connect(url + BIDI, max_size=None) as ws:
        started = time.perf_counter()
        await ws.send(orjson.dumps({"text": text, "request_id": rid}))
        first = last = None
        async for frame in ws:
            if isinstance(frame, bytes):
                last = time.perf_counter()
                first = first or last
                continue
            event = orjson.loads(frame)
            if event["type"] == "synthesis_complete":
                assert first is not None
                assert last is not None
                return first - started, last - started, float(event["total_duration_s"])
            if event["type"] == "error":
                raise RuntimeError(event)
    raise RuntimeError("closed early")


def raw_whole_call(settings: Settings, voice: str) -> Callable[[str], float]:
    """One call of the whole sentence outside the server, by `settings.engine`: its seconds."""
    if settings.engine == "torch":
        return raw_torch_call(settings, voice)
    return raw_onnx_call(settings.engine_threads, voice)


def raw_torch_call(settings: Settings, voice: str) -> Callable[[str], float]:
    """One call of a torch engine of its own (KModel's forward, the server's device and
    checkpoint) for a text: its seconds, the audio on the host (so CUDA has finished)."""
    from model_server.engines.base import CancelToken
    from model_server.service import default_engine_factory
    from model_server.text.g2p import english_g2p

    engine = default_engine_factory(settings)
    g2p = english_g2p()

    def call(text: str) -> float:
        phonemes = g2p(text)
        started = time.perf_counter()
        engine.infer(phonemes, voice, 1.0, CancelToken())
        return time.perf_counter() - started

    return call


def raw_onnx_call(threads: int, voice: str) -> Callable[[str], float]:
    """One raw onnxruntime call of the registry's graph for a text: its seconds."""
    import numpy as np
    import onnxruntime as ort

    from model_server.engines import voices as voice_packs
    from model_server.engines.base import style_row, tokenize
    from model_server.engines.weights import assemble_model, default_cache_dir, load_vocab
    from model_server.text.g2p import english_g2p

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(
        str(assemble_model(default_cache_dir())), so, providers=["CPUExecutionProvider"]
    )
    vocab, g2p = load_vocab(), english_g2p()
    pack = voice_packs.load_voices()[0][voice]

    def call(text: str) -> float:
        tokens = tokenize(g2p(text), vocab, 510)
        feed: dict[str, Any] = {
            "tokens": np.array([[0, *tokens, 0]], np.int64),
            "style": pack[style_row(len(tokens), len(pack))].reshape(1, -1).astype(np.float32),
            "speed": np.array([1.0], np.float32),
        }
        started = time.perf_counter()
        session.run(["audio"], feed)
        return time.perf_counter() - started

    return call


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


async def progressive_table(
    urls: dict[str, str], raw: Callable[[str], float], runs: int
) -> list[tuple[str, ...]]:
    for url in urls.values():
        await first_and_last(url, TEXTS["short"], "warm")
    raw(TEXTS["short"])
    rows: list[tuple[str, ...]] = []
    for name, text in BY_LENGTH.items():
        got: dict[str, list[tuple[float, float, float]]] = {mode: [] for mode in urls}
        whole: list[float] = []
        order = ["raw", *urls]
        for r in range(runs):
            for mode in order[r % len(order) :] + order[: r % len(order)]:
                if mode == "raw":
                    whole.append(await asyncio.to_thread(raw, text))
                else:
                    got[mode].append(await first_and_last(urls[mode], text, f"{name}{r}{mode}"))
        audio = next(iter(got.values()))[0][2]
        cells = [f"{name} ({audio:.1f} s)", f"{statistics.median(whole) * 1000:.0f}"]
        for mode in urls:
            first = [g[0] for g in got[mode]]
            last = [g[1] for g in got[mode]]
            cells += [
                f"{statistics.median(first) * 1000:.0f}",
                f"{statistics.median(last) * 1000:.0f}",
                _spread([f / w for f, w in zip(first, whole, strict=True)]),
                _spread([la / w for la, w in zip(last, whole, strict=True)]),
            ]
        rows.append(tuple(cells))
        print(" | ".join(rows[-1]), flush=True)
    return rows


def print_table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))


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
    parser.add_argument("--concurrency", default="1,2,4,8", help="empty: no concurrent rows")
    parser.add_argument(
        "--sections", default="progressive,server", help="which tables: progressive, server"
    )
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
    levels = [int(x) for x in args.concurrency.split(",") if x]
    sections = set(args.sections.split(","))

    def table(url: str) -> None:
        rows = asyncio.run(run(url, args.runs, levels))
        header = ("case", "sessions", "TTFA p50 ms", "TTFA p95 ms", "RTF")
        print(f"\nmodel server at {url}, {os.cpu_count()} cores, {args.runs} runs per row")
        print_table(header, rows)

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
        if "progressive" in sections:
            progressive(settings, args.runs)
        if "server" in sections:
            with local_server(settings) as url:
                print(
                    f"local server: engine {args.engine}, {args.workers} workers, "
                    f"threads {args.threads or 'auto'}, progressive {settings.progressive}"
                )
                table(url)


def progressive(settings: Settings, runs: int) -> None:
    with ExitStack() as stack:
        modes = {"on": dataclasses.replace(settings, progressive=True)}
        if settings.engine == "onnx":  # the streamed decoder (default) and the windows before
            modes = {
                "stream": dataclasses.replace(settings, progressive=True, decoder="stream"),
                "windows": dataclasses.replace(settings, progressive=True, decoder="windows"),
            }
        modes["off"] = dataclasses.replace(settings, progressive=False)
        urls = {mode: stack.enter_context(local_server(s)) for mode, s in modes.items()}
        voice = settings.default_voice or "jm_kumo"
        raw = raw_whole_call(settings, voice)
        where = (
            f"torch on {settings.device}"
            if settings.engine == "torch"
            else f"onnx, {settings.engine_threads} threads a call"
        )
        print(
            f"\nprogressive synthesis: one session, {os.cpu_count()} cores, {where}, "
            f"voice {voice}, {runs} runs per row "
            "(ratios: median [range] of the runs' ratios to the raw call)"
        )
        header: tuple[str, ...] = ("sentence", "raw whole ms")
        for mode in urls:
            header += (
                f"{mode}: first ms",
                f"{mode}: last ms",
                f"{mode}: first / raw",
                f"{mode}: last / raw",
            )
        print(" | ".join(header), flush=True)
        rows = asyncio.run(progressive_table(urls, raw, runs))
        print()
        print_table(header, rows)


if __name__ == "__main__":
    main()
