"""Barge-ins through one version of the plugins, in a process of its own (the barge-in scenario
of make bench-frameworks).

Both versions of the plugins have the same package names (`pipecat_kokoro_voice`,
`livekit.plugins.kokoro_voice`, `kokoro_voice_client`), so `bench.bench_frameworks` runs one
of these per version, its `PYTHONPATH` naming that version's `integrations/` first. It prints
`READY` and a JSON line (the files the plugins were imported from, checked against
`--integrations`), then reads one plugin name a line on stdin (`pipecat` or `livekit`) and for
each runs one barge-in against the gateway at `--url` and prints `RESULT` and a JSON line
(`BargeIn`; one that failed, a turn the gateway refused say, with its `error`: pipecat's
service's first error frame, LiveKit's exception), until stdin ends. Any other line on stdout is
not one of those (pipecat's logs go to stderr).

A barge-in: a turn speaking `--text` (several sentences) on a connection opened before the
clock starts, its first audio waited for, then the interruption, the framework's own way, and
the next turn's `--next-text` at once; timed from the interruption to the next turn's first
audio leaving the plugin (pipecat: the first `TTSAudioRawFrame` of another context than the
interrupted one; LiveKit: the new stream's first audio event). The old turn's audio frames the
plugin still hands on after the interruption are counted (`leftover_frames`: pipecat, those
after the `InterruptionFrame` itself has come through, which a transport would play; those that
came out between the interruption's queueing and its coming through, which the transport drops
as the interruption reaches it, are `overtaken_frames`; LiveKit: what the closed stream still
gives its consumer).

- pipecat: `KokoroVoiceTTSService` in a pipeline of its own; the turn a `TTSSpeakFrame`; the
  interruption an `InterruptionFrame` queued into the pipeline, as a pipeline's user turn does,
  then the next turn's `TTSSpeakFrame`.
- LiveKit: `livekit.plugins.kokoro_voice.TTS`, the turn a `SynthesizeStream` fed the text word
  by word; the interruption the agent's: the stream's `aclose()` (an interrupted speech closes
  its TTS stream), then a new stream for the next turn.

    PYTHONPATH=... python -m bench.frameworks.barge_in_runner --url URL --voice V \\
        --integrations DIR [--text ...] [--next-text ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.frameworks import BargeIn

READY = "READY "
RESULT = "RESULT "
LIMIT_S = 120.0  # any one wait; a barge-in that takes this long has failed


def _seconds(pcm_bytes: int, rate: int) -> float:
    return pcm_bytes / (2 * rate)  # s16 mono


# --- pipecat ---------------------------------------------------------------------------------


async def pipecat_barge_in(url: str, voice: str, text: str, next_text: str) -> BargeIn:
    from pipecat.frames.frames import (
        EndFrame,
        ErrorFrame,
        Frame,
        InterruptionFrame,
        TTSAudioRawFrame,
        TTSSpeakFrame,
        TTSStoppedFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner
    from pipecat_kokoro_voice import KokoroVoiceTTSService

    from bench.frameworks.pipecat import run_with

    class Recorder(FrameProcessor):
        """At the end of the pipeline: each audio frame as it leaves the service (when, whose,
        how many bytes at what rate), and each context's end."""

        def __init__(self) -> None:
            super().__init__()
            self.audio: list[tuple[float, str | None, int, int]] = []
            self.stopped: set[str | None] = set()
            self.interruption_at: float | None = None  # the InterruptionFrame came through
            self.changed = asyncio.Event()
            self.errors: list[str] = []

        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSAudioRawFrame):
                self.audio.append(
                    (time.perf_counter(), frame.context_id, len(frame.audio), frame.sample_rate)
                )
                self.changed.set()
            elif isinstance(frame, InterruptionFrame) and self.interruption_at is None:
                self.interruption_at = time.perf_counter()
            elif isinstance(frame, TTSStoppedFrame):
                self.stopped.add(frame.context_id)
                self.changed.set()
            await self.push_frame(frame, direction)

        async def until(self, found: Any) -> Any:
            """The first non-None `found()`, checked at each frame recorded; the service's
            first error (a refused turn gets no audio) is raised instead."""
            async with asyncio.timeout(LIMIT_S):
                while (value := found()) is None:
                    if self.errors:
                        raise RuntimeError(self.errors[0])
                    self.changed.clear()
                    await self.changed.wait()
                return value

    class Errors(FrameProcessor):
        """Before the service: the errors it pushes upstream, told to the recorder."""

        def __init__(self, recorder: Recorder) -> None:
            super().__init__()
            self.recorder = recorder

        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            await super().process_frame(frame, direction)
            if isinstance(frame, ErrorFrame) and direction is FrameDirection.UPSTREAM:
                self.recorder.errors.append(frame.error)
                self.recorder.changed.set()
            await self.push_frame(frame, direction)

    tts = KokoroVoiceTTSService(url=url, settings=KokoroVoiceTTSService.Settings(voice=voice))
    recorder = Recorder()
    pipeline = Pipeline([Errors(recorder), tts, recorder])
    worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False)
    ready = asyncio.Event()

    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        ready.set()

    worker.add_event_handler("on_pipeline_started", _started)
    outcome: dict[str, Any] = {}

    async def script() -> None:
        await asyncio.wait_for(ready.wait(), 30)  # connected: setup opened the socket
        spoken = time.perf_counter()
        await worker.queue_frame(TTSSpeakFrame(text))
        at, old, _, _ = await recorder.until(lambda: recorder.audio[0] if recorder.audio else None)
        interrupted = time.perf_counter()
        await worker.queue_frame(InterruptionFrame())
        await worker.queue_frame(TTSSpeakFrame(next_text))

        def next_audio() -> tuple[float, str | None, int, int] | None:
            return next((a for a in recorder.audio if a[0] >= interrupted and a[1] != old), None)

        first_next, new, first_bytes, first_rate = await recorder.until(next_audio)
        await recorder.until(lambda: True if new in recorder.stopped else None)
        await asyncio.sleep(0.5)  # anything late of the old turn
        through = recorder.interruption_at
        if through is None:
            raise RuntimeError("the InterruptionFrame never came through the pipeline")
        old_after = [a for a in recorder.audio if a[0] >= interrupted and a[1] == old]
        outcome.update(
            first_audio_s=at - spoken,
            barge_in_s=first_next - interrupted,
            leftover=[a for a in old_after if a[0] >= through],
            overtaken=[a for a in old_after if a[0] < through],
            next=[a for a in recorder.audio if a[1] == new],
            next_first_frame_s=_seconds(first_bytes, first_rate),
        )
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await run_with(runner, script())
    leftover, overtaken, nxt = outcome["leftover"], outcome["overtaken"], outcome["next"]
    return BargeIn(
        plugin="pipecat",
        barge_in_s=outcome["barge_in_s"],
        first_audio_s=outcome["first_audio_s"],
        leftover_frames=len(leftover),
        leftover_s=sum(_seconds(n, rate) for _, _, n, rate in leftover),
        overtaken_frames=len(overtaken),
        overtaken_s=sum(_seconds(n, rate) for _, _, n, rate in overtaken),
        next_audio_s=sum(_seconds(n, rate) for _, _, n, rate in nxt),
        next_first_frame_s=outcome["next_first_frame_s"],
    )


# --- LiveKit ---------------------------------------------------------------------------------


async def _warm_livekit(tts: Any) -> None:
    """The connection open before the clock starts, as `prewarm()` leaves it, whichever
    version: c2154e7's pool of sockets (one taken and given back), or v2's shared socket."""
    pool = getattr(tts, "_pool", None)
    if pool is not None:
        pool.put(await pool.get(timeout=10))
    else:
        await tts._shared_socket(10)


async def livekit_barge_in(url: str, voice: str, text: str, next_text: str) -> BargeIn:
    from livekit.agents.types import APIConnectOptions
    from livekit.agents.utils import http_context
    from livekit.plugins import kokoro_voice

    from bench.frameworks.gateway_ws import deltas

    no_retry = APIConnectOptions(max_retry=0)
    async with (
        http_context.open(),
        kokoro_voice.TTS(base_url=url, voice=voice) as tts,
    ):
        rate = tts.sample_rate
        await _warm_livekit(tts)
        old = tts.stream(conn_options=no_retry)
        spoken = time.perf_counter()
        for delta in deltas(text):
            old.push_text(delta)
        old.end_input()
        async with asyncio.timeout(LIMIT_S):
            await anext(old)
        first_audio = time.perf_counter() - spoken
        interrupted = time.perf_counter()
        await old.aclose()  # the agent's barge-in: returns at once
        new = tts.stream(conn_options=no_retry)
        new.push_text(next_text)
        new.end_input()
        async with asyncio.timeout(LIMIT_S):
            event = await anext(new)
            barge_in = time.perf_counter() - interrupted
            next_bytes = len(event.frame.data.tobytes())
            async for event in new:
                next_bytes += len(event.frame.data.tobytes())
        leftover_frames = leftover_bytes = 0
        async with asyncio.timeout(5):  # what the closed stream still hands its consumer
            async for event in old:
                leftover_frames += 1
                leftover_bytes += len(event.frame.data.tobytes())
        await new.aclose()
    return BargeIn(
        plugin="livekit",
        barge_in_s=barge_in,
        first_audio_s=first_audio,
        leftover_frames=leftover_frames,
        leftover_s=_seconds(leftover_bytes, rate),
        overtaken_frames=0,  # the stream's close is the interruption: nothing overtakes it
        overtaken_s=0.0,
        next_audio_s=_seconds(next_bytes, rate),
        next_first_frame_s=None,  # the emitter's frames, not the gateway's
    )


PLUGINS = {"pipecat": pipecat_barge_in, "livekit": livekit_barge_in}


def imported_from() -> dict[str, str]:
    """Where each package of the plugins was imported from."""
    import kokoro_voice_client
    import pipecat_kokoro_voice
    from livekit.plugins import kokoro_voice

    return {
        module.__name__: str(Path(str(module.__file__)).resolve())
        for module in (kokoro_voice_client, pipecat_kokoro_voice, kokoro_voice)
    }


def emit(prefix: str, body: dict[str, Any]) -> None:
    sys.stdout.write(prefix + json.dumps(body) + "\n")
    sys.stdout.flush()


async def serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    while line := (await loop.run_in_executor(None, sys.stdin.readline)).strip():
        if line not in PLUGINS:
            emit(RESULT, asdict(BargeIn(line, 0, 0, 0, 0, 0, 0, 0, 0, error=f"no plugin {line!r}")))
            continue
        try:
            result = await PLUGINS[line](args.url, args.voice, args.text, args.next_text)
        except Exception as exc:
            result = BargeIn(line, 0, 0, 0, 0, 0, 0, 0, 0, error=f"{type(exc).__name__}: {exc}")
        emit(RESULT, asdict(result))


def main() -> None:
    from bench.bench_gateway import ANSWER, SECOND

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="the gateway")
    parser.add_argument("--voice", required=True)
    parser.add_argument("--integrations", required=True, help="where the plugins must come from")
    parser.add_argument("--text", default=ANSWER, help="the turn interrupted")
    parser.add_argument("--next-text", default=SECOND, help="the turn after the barge-in")
    args = parser.parse_args()
    root = Path(args.integrations).resolve()
    found = imported_from()
    strays = {name: path for name, path in found.items() if not Path(path).is_relative_to(root)}
    if strays:
        raise SystemExit(f"plugins imported from outside {root}: {strays}")
    emit(READY, found)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
