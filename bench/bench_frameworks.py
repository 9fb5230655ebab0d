"""The voice-agent frameworks' plugins side by side with the gateway's own WebSocket: first
audio and first word timestamp from the moment the text is handed over; and barge-in to the next
turn's first audio through each plugin, the plugins before protocol 2 against today's (make
bench-frameworks).

Starts a real model server (Kokoro-82M int8 on onnxruntime) and a gateway in front of it, each
its own process on a loopback port (`bench.harness.stack`), then runs the scenarios asked for
(`--scenario`, default `first-audio`):

- `first-audio`: each client in `CLIENTS` on the same reply, one warm-up each, then `--runs`
  rounds, the clients' order alternating between rounds; prints the medians and ranges, and each
  client's first audio against the baseline's (the first client). A client is a module of
  `bench/frameworks/` with `async def run(url, api_key, text, voice) -> FrameworkRun`; adding
  one is one line below.
- `barge-in`: for the plugins among `--clients` (pipecat, LiveKit), a turn speaking a
  five-sentence answer is interrupted at its first audio the framework's way and the next turn
  ("Yes, of course, one moment.") spoken at once (`bench.frameworks.barge_in_runner`), timed
  from the interruption to the next turn's first audio out of the plugin; and the interrupted
  turn's audio frames the plugin still hands on after the interruption counted (pipecat: those
  after the `InterruptionFrame` came through the pipeline, and apart, those that came out
  between its queueing and its coming through, which a transport would drop). Today's plugins
  (protocol 2: contexts on one socket, the next turn not waiting for the cancel's answer)
  against the plugins as they were at `--old` (c2154e7, before protocol 2: pipecat's own queue,
  the next utterance's `speak` sent at the old one's `cancelled`; LiveKit a pooled socket per
  stream in flight; both protocol 1, which the gateway still serves), the two versions each in
  a process of its own against the same gateway, the old one's `PYTHONPATH` naming
  `integrations/` as `git archive` gives it at that commit (in a temporary folder, removed
  after). One warm-up per plugin and version, then `--runs` rounds, the versions' order
  alternating between rounds; prints per plugin each version's median and range and v2's
  against the old one's.

    .venv/bin/python -m bench.bench_frameworks [--runs 5] [--voice jf_alpha] [--text "..."] \\
        [--scenario first-audio|barge-in|both] [--old c2154e7]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import IO

import httpx

from bench.bench_gateway import ANSWER, SECOND
from bench.frameworks import BargeIn, FrameworkRun
from bench.frameworks.barge_in_runner import PLUGINS, READY, RESULT
from bench.harness import stack

CLIENTS = (
    "gateway_ws",  # the baseline: the gateway's speak WebSocket driven with `websockets`
    "pipecat",  # pipecat_kokoro_voice.KokoroVoiceTTSService
    "livekit",  # livekit.plugins.kokoro_voice.TTS
)
TEXT = (
    "Sure, I can help with that. Your order shipped this morning, and it should arrive on Tuesday."
)

ROOT = Path(__file__).resolve().parents[1]
OLD = "c2154e7"  # the plugins before protocol 2
SCENARIOS = ("first-audio", "barge-in", "both")
VERSIONS = ("old", "v2")

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


@contextlib.contextmanager
def integrations_at(commit: str) -> Iterator[Path]:
    """`integrations/` as it was at `commit` (`git archive`), in a temporary folder removed
    after."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "integrations"],
        check=True,
        capture_output=True,
    ).stdout
    with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp) / "integrations"


class Runner:
    """A `bench.frameworks.barge_in_runner` process with the plugins of `integrations` (and
    this checkout's `bench`) on its `PYTHONPATH`, and nothing else of the plugins before it."""

    def __init__(self, label: str, integrations: Path, url: str, voice: str) -> None:
        self.label = label
        path = [str(integrations / name) for name in ("client", "pipecat", "livekit")]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*path, str(ROOT)]),
            "LOGURU_LEVEL": "WARNING",  # pipecat's loguru: warnings and errors only
            "PYTHONUNBUFFERED": "1",
        }
        command = [sys.executable, "-m", "bench.frameworks.barge_in_runner"]
        command += ["--url", url, "--voice", voice, "--integrations", str(integrations)]
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )
        self.imported: dict[str, str] = json.loads(self._read(READY))

    def _read(self, prefix: str) -> str:
        stdout: IO[str] | None = self.proc.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith(prefix):
                return line[len(prefix) :]
        raise RuntimeError(f"the {self.label} runner exited ({self.proc.wait()})")

    def barge_in(self, plugin: str) -> BargeIn:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write(plugin + "\n")
        stdin.flush()
        return BargeIn(**json.loads(self._read(RESULT)))  # a failed one says why (`error`)

    def close(self) -> None:
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()  # the runner ends at the end of its input
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def runners(old: str, url: str, voice: str) -> Iterator[dict[str, Runner]]:
    """The old plugins' runner and today's, each closed (and the old copy removed) after."""
    with contextlib.ExitStack() as stack_:
        old_integrations = stack_.enter_context(integrations_at(old))
        started: dict[str, Runner] = {}

        @stack_.callback
        def _close() -> None:
            for runner in started.values():
                runner.close()

        started["old"] = Runner(f"old ({old})", old_integrations, url, voice)
        started["v2"] = Runner("v2", ROOT / "integrations", url, voice)
        yield started


def measure_barge_ins(
    runners: dict[str, Runner], plugins: Sequence[str], runs: int
) -> dict[str, dict[str, list[BargeIn]]]:
    """One warm-up per plugin and version (not kept), then `runs` rounds, the versions' order
    reversed every other one. A barge-in that failed (a refused turn: `error`) is kept, and
    the rounds go on."""
    for plugin in plugins:
        for version in VERSIONS:
            runners[version].barge_in(plugin)
    results: dict[str, dict[str, list[BargeIn]]] = {p: {v: [] for v in VERSIONS} for p in plugins}
    for i in range(runs):
        for plugin in plugins:
            for version in VERSIONS if i % 2 == 0 else list(reversed(VERSIONS)):
                results[plugin][version].append(runners[version].barge_in(plugin))
    return results


def _median_s(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    return f"{statistics.median(known):.2f}" if known else "-"


def barge_in_table(results: dict[str, dict[str, list[BargeIn]]], old: str) -> str:
    """Markdown: per plugin each version's barge-in to the next turn's first audio (median and
    range, ms), v2's against the old one's, the interrupted turn's audio handed on after the
    interruption and that it overtook (frames and seconds, all runs together), the next turn's
    audio and the audio in its first frame (medians), of the barge-ins that did not fail; and
    how many failed, each version's first error under the table."""
    lines = [
        f"| plugin | old ({old}) ms, median (range) | v2 ms, median (range) | v2 / old | "
        "old turn's audio after the interruption, old / v2 (frames, s; all runs) | "
        "old turn's audio overtaken by the interruption, old / v2 (frames, s; all runs) | "
        "next turn's audio s, old / v2 | next turn's first frame s, old / v2 | failed, old / v2 |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    errors: list[str] = []
    for plugin, by_version in results.items():
        failed = " / ".join(str(sum(r.error is not None for r in by_version[v])) for v in VERSIONS)
        for version in VERSIONS:
            first_error = next((r.error for r in by_version[version] if r.error), None)
            if first_error:
                errors.append(f"{plugin} {version}: {first_error}")
        was, now = ([r for r in by_version[v] if r.error is None] for v in VERSIONS)
        if not was or not now:
            lines.append(f"| {plugin} | - | - | - | - | - | - | - | {failed} |")
            continue
        ratio = statistics.median(r.barge_in_s for r in now) / statistics.median(
            r.barge_in_s for r in was
        )
        frames = " / ".join(str(sum(r.leftover_frames for r in v)) for v in (was, now))
        seconds = " / ".join(f"{sum(r.leftover_s for r in v):.2f}" for v in (was, now))
        overtaken = " / ".join(str(sum(r.overtaken_frames for r in v)) for v in (was, now))
        overtaken_s = " / ".join(f"{sum(r.overtaken_s for r in v):.2f}" for v in (was, now))
        audio = " / ".join(
            f"{statistics.median(r.next_audio_s for r in v):.2f}" for v in (was, now)
        )
        first = " / ".join(_median_s([r.next_first_frame_s for r in v]) for v in (was, now))
        lines.append(
            f"| {plugin} | {_spread([r.barge_in_s for r in was])} | "
            f"{_spread([r.barge_in_s for r in now])} | {ratio:.2f}x | "
            f"{frames} frames, {seconds} s | {overtaken} frames, {overtaken_s} s | {audio} | "
            f"{first} | {failed} |"
        )
    return "\n".join(lines + errors)


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
    parser.add_argument("--text", default=TEXT, help="first-audio's reply")
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated")
    parser.add_argument("--scenario", choices=SCENARIOS, default="first-audio")
    parser.add_argument("--old", default=OLD, help="barge-in: the commit of the old plugins")
    args = parser.parse_args()
    quiet_framework_logs()
    clients = [c for c in args.clients.split(",") if c]
    plugins = [c for c in clients if c in PLUGINS]
    first_audio = args.scenario in ("first-audio", "both")
    barge_in = args.scenario in ("barge-in", "both") and plugins
    results: dict[str, list[FrameworkRun]] = {}
    barge_ins: dict[str, dict[str, list[BargeIn]]] = {}
    imported: dict[str, dict[str, str]] = {}
    # every run comes from this one address: the per-client reply quota (60 a minute) would
    # refuse a long run's later turns
    with stack([], ["--replies-per-minute", "0"]) as running:
        voice = args.voice or default_voice(running.gateway)
        if first_audio:
            results = asyncio.run(measure(running.gateway, clients, args.runs, args.text, voice))
        if barge_in:
            with runners(args.old, running.gateway, voice) as started:
                imported = {v: r.imported for v, r in started.items()}
                barge_ins = measure_barge_ins(started, plugins, args.runs)
    if first_audio:
        print(
            f"{args.runs} runs per client (after one warm-up), voice {voice}, text: {args.text!r}"
        )
        print(table(results, args.text))
    if barge_in:
        if first_audio:
            print()
        print(
            f"barge-in to the next turn's first audio, {args.runs} runs per plugin and version "
            f"(after one warm-up each), voice {voice}: {ANSWER!r} interrupted at its first "
            f"audio, then {SECOND!r}"
        )
        for version, found in imported.items():
            print(f"{version}: " + ", ".join(f"{m} from {p}" for m, p in found.items()))
        print(barge_in_table(barge_ins, args.old))


if __name__ == "__main__":
    main()
