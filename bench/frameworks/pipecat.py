"""pipecat: `pipecat_kokoro_voice.KokoroVoiceTTSService` in a pipeline of its own, fed the
text as an LLM's tokens (LLMFullResponseStartFrame, one LLMTextFrame per word, the end
frame); timed from the moment the frames are queued to the first `TTSAudioRawFrame` and the
first `TTSTextFrame` (a word timestamp) leaving the service."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner
from pipecat_kokoro_voice import KokoroVoiceTTSService

from bench.frameworks import FrameworkRun
from bench.frameworks.gateway_ws import BYTES_PER_SECOND, deltas


class _Recorder(FrameProcessor):
    """At the end of the pipeline: when the first audio and the first word came, what came."""

    def __init__(self) -> None:
        super().__init__()
        self.started = 0.0
        self.first_audio: float | None = None
        self.first_word: float | None = None
        self.audio_bytes = 0
        self.words: list[str] = []
        self.done = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        now = time.perf_counter() - self.started
        if isinstance(frame, TTSAudioRawFrame):
            self.first_audio = now if self.first_audio is None else self.first_audio
            self.audio_bytes += len(frame.audio)
        elif isinstance(frame, TTSTextFrame):
            self.first_word = now if self.first_word is None else self.first_word
            self.words.append(frame.text)
        elif isinstance(frame, TTSStoppedFrame):
            self.done.set()
        await self.push_frame(frame, direction)


async def run_with(runner: WorkerRunner, script: Awaitable[None]) -> None:
    """Run the runner's pipelines while `script` drives them; the script ends them (an
    EndFrame) when it is done, and if it fails the runner is cancelled (not left running
    with nobody to end it) and the script's error raised once the runner has stopped."""

    async def _script() -> None:
        try:
            await script
        except BaseException:
            await runner.cancel("the script driving the pipeline failed")
            raise

    outcomes = await asyncio.gather(runner.run(), _script(), return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome


async def run(url: str, api_key: str | None, text: str, voice: str) -> FrameworkRun:
    tts = KokoroVoiceTTSService(
        url=url, api_key=api_key, settings=KokoroVoiceTTSService.Settings(voice=voice)
    )
    recorder = _Recorder()
    worker = PipelineWorker(Pipeline([tts, recorder]), cancel_on_idle_timeout=False)
    ready = asyncio.Event()

    async def _started(worker: PipelineWorker, frame: Frame) -> None:
        ready.set()

    worker.add_event_handler("on_pipeline_started", _started)

    async def feed() -> None:
        await asyncio.wait_for(ready.wait(), 30)  # connected: setup opened the socket
        frames: list[Frame] = [LLMFullResponseStartFrame()]
        frames += [LLMTextFrame(delta) for delta in deltas(text)]
        frames.append(LLMFullResponseEndFrame())
        recorder.started = time.perf_counter()
        for frame in frames:
            await worker.queue_frame(frame)
        await asyncio.wait_for(recorder.done.wait(), 120)
        await worker.queue_frame(EndFrame())

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await run_with(runner, feed())
    if recorder.first_audio is None:
        raise RuntimeError("no audio came back")
    return FrameworkRun(
        "pipecat",
        recorder.first_audio,
        recorder.first_word,
        recorder.audio_bytes / BYTES_PER_SECOND,
        tuple(recorder.words),
    )
