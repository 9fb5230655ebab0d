"""The voice-agent frameworks' plugins side by side with the gateway's own WebSocket: first
audio and first word timestamp from the moment the text is handed over (make bench-frameworks).

Starts a real model server (Kokoro-82M int8 on onnxruntime) and a gateway in front of it, each
its own process on a loopback port (`bench.harness.stack`), then runs each client in
`CLIENTS` on the same reply, one warm-up each, then `--runs` rounds, the clients' order
alternating between rounds; prints the medians and ranges, and each client's first audio
against the baseline's (the first client). A client is a module of `bench/frameworks/` with
`async def run(url, api_key, text, voice) -> FrameworkRun`; adding one is one line below.

    .venv/bin/python -m bench.bench_frameworks [--runs 5] [--voice jf_alpha] [--text "..."]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import statistics
import sys
from collections.abc import Awaitable, Callable, Sequence

import httpx

from bench.frameworks import FrameworkRun
from bench.harness import stack

CLIENTS = (
    "gateway_ws",  # the baseline: the gateway's speak WebSocket driven with `websockets`
    "pipecat",  # pipecat_kokoro_voice.KokoroVoiceTTSService
    "livekit",  # livekit.plugins.kokoro_voice.TTS
)
TEXT = (
    "Sure, I can help with that. Your order shipped this morning, and it should arrive on Tuesday."
)

Client = Callable[[str, str | None, str, str], Awaitable[FrameworkRun]]


def load(name: str) -> Client:
    run: Client = importlib.import_module(f"bench.frameworks.{name}").run
    return run


async def measure(
    url: str, clients: Sequence[str], runs: int, text: str, voice: str
) -> dict[str, list[FrameworkRun]]:
    """One warm-up per client (not kept), then `runs` rounds, every other one reversed."""
    loaded = {name: load(name) for name in clients}
    for name in clients:
        await loaded[name](url, None, text, voice)
    results: dict[str, list[FrameworkRun]] = {name: [] for name in clients}
    for i in range(runs):
        for name in clients if i % 2 == 0 else list(reversed(clients)):
            results[name].append(await loaded[name](url, None, text, voice))
    return results


def _spread(values: Sequence[float]) -> str:
    ms = [v * 1000 for v in values]
    return f"{statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f})"


def table(results: dict[str, list[FrameworkRun]], text: str) -> str:
    """Markdown: per client the medians and ranges, in ms."""
    baseline = statistics.median(r.first_audio_s for r in next(iter(results.values())))
    lines = [
        "| client | first audio ms, median (range) | vs baseline | first word ms | audio s | "
        "words timed |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    expected = len(text.split())
    for name, runs in results.items():
        first_audio = [r.first_audio_s for r in runs]
        words = [r.first_word_s for r in runs if r.first_word_s is not None]
        audio = statistics.median(r.audio_s for r in runs)
        timed = statistics.median(len(r.words) for r in runs)
        lines.append(
            f"| {name} | {_spread(first_audio)} | "
            f"{statistics.median(first_audio) / baseline:.2f}x | "
            f"{_spread(words) if words else '-'} | {audio:.2f} | {timed:.0f}/{expected} |"
        )
    return "\n".join(lines)


def default_voice(url: str) -> str:
    body = httpx.get(url + "/v1/voices", timeout=30).json()
    for key in ("default", "default_voice"):
        if isinstance(body, dict) and isinstance(body.get(key), str):
            return str(body[key])
    raise SystemExit(f"no default voice in GET /v1/voices: {body!r}; pass --voice")


def quiet_framework_logs() -> None:
    """pipecat logs through loguru at DEBUG by default: warnings and errors only here."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level="WARNING")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--voice", default=None, help="default: the model server's default")
    parser.add_argument("--text", default=TEXT)
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated")
    args = parser.parse_args()
    quiet_framework_logs()
    clients = [c for c in args.clients.split(",") if c]
    with stack([], []) as running:
        voice = args.voice or default_voice(running.gateway)
        results = asyncio.run(measure(running.gateway, clients, args.runs, args.text, voice))
    print(f"{args.runs} runs per client (after one warm-up), voice {voice}, text: {args.text!r}")
    print(table(results, args.text))


if __name__ == "__main__":
    main()
