"""A fast, controllable stand-in for the Kokoro engine, for protocol edge cases.

The real onnx engine is covered end to end in tests/model_server/test_real_model.py; this one makes
in-flight states (a synthesis that is running right now) observable without timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from gateway.reply.plan.config import PlanConfig
from model_server.app import create_app
from model_server.config import Settings
from model_server.engines.base import CancelToken, FloatAudio, Front, Pause, Timed
from model_server.errors import SynthesisCancelled, SynthesisFailed
from model_server.windows import Window
from tests.support.servers import RunningServer, serve

# the fake model servers' settings: small limits, so that tests reach them; the text limit is
# the gateway's longest chunk, so that a gateway in front of one never cuts past it (a chunk
# plan on a slow machine groups more text while the first chunk plays)
# no voice prepared in the background (tests/model_server/test_voice_preparation.py does)
FAKE_SETTINGS = Settings(
    workers=2,
    max_text_chars=PlanConfig().max_chars,
    max_pending=4,
    warmup=False,
    prepare_voices=False,
)

SECONDS_PER_PHONEME = 0.01
# Every phoneme (character) lasts one frame, 10 ms at speed 1 (240 samples), int(240 / speed)
# samples at other speeds; the pads last none. So a word's timings follow from the text alone:
# with the identity G2P, character i of a segment starts at i * 10 ms (before trimming, which
# cuts nothing at the start: the square wave is loud from its first sample).
SAMPLES_PER_PHONEME = int(SECONDS_PER_PHONEME * 24_000)


def frame_samples(speed: float) -> int:
    return int(SAMPLES_PER_PHONEME / speed)


class FakeEngine:
    name = "fake"
    description = "fake on cpu"
    max_phonemes = 510
    two_passes = False
    voice_note = ""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every call: the suite shares one fake model server between tests."""
        self.gate = threading.Event()  # infer blocks until set (or cancelled) when `hold` is on
        self.hold = False
        self.hold_after: int | None = None  # with a number: the calls after that many hold
        self.entered = threading.Event()
        self.cancelled: list[str] = []
        self.cancel_seen = threading.Event()
        self.calls: list[str] = []
        self.voices_called: list[str] = []  # each call's voice (a blend: its canonical name)

    def voices(self) -> dict[str, str]:
        return {"jf_alpha": "fake", "af_test": "fake"}

    def batch_curve(self) -> dict[str, float] | None:
        return None  # each call alone

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        return self.infer_timed(phonemes, voice, speed, cancel).audio

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        self.calls.append(phonemes)
        self.voices_called.append(voice)
        if self.hold or (self.hold_after is not None and len(self.calls) > self.hold_after):
            cancel.on_cancel(self.gate.set)
            self.entered.set()
            self.gate.wait(timeout=30)
            if cancel.cancelled:
                self.cancelled.append(phonemes)
                self.cancel_seen.set()
                raise SynthesisCancelled()
        frame = frame_samples(speed)
        n = len(phonemes) * frame
        # a 218 Hz square wave: every sample is loud, so trimming only adds the tail pause
        audio = np.where((np.arange(n) // 55) % 2 == 0, 0.5, -0.5).astype(np.float32)
        durations = np.array([0, *([1] * len(phonemes)), 0], np.int64)
        return Timed(audio, durations, frame)


class FailingEngine(FakeEngine):
    """Fails as onnxruntime does (its error naming a model file's path) on a segment whose
    phonemes hold `fails_on` (every one: ""), after the segments before it spoke."""

    failure = "onnxruntime failed: /opt/ml/model/kokoro.onnx: node /decoder/Conv"

    def __init__(self, fails_on: str = "") -> None:
        super().__init__()
        self.fails_on = fails_on

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        if self.fails_on in phonemes:
            self.calls.append(phonemes)
            raise SynthesisFailed(self.failure)
        return super().infer_timed(phonemes, voice, speed, cancel)


def identity_g2p() -> IdentityG2P:
    return IdentityG2P()


class IdentityG2P:
    """Treats every character as one phoneme: durations follow text length exactly."""

    name = "identity"

    def __call__(self, text: str) -> str:
        return text.strip()


def expected_pcm_bytes(text: str, speed: float = 1.0) -> int:
    """PCM bytes the fake engine yields for one segment: the square wave plus the tail pause."""
    from model_server.audio import TrimPolicy

    n = len(text) * frame_samples(speed)
    policy = TrimPolicy()
    tail = int(policy.tail_s * 24_000)
    return 2 * (n + tail) if n else 0


def paced_reply_bytes(text: str) -> int:
    """PCM bytes of a reply of `text` from the echo source (its tokens) under the gateway's
    `sentences` plan (its default chunker) and the fake engine: each chunk the plan cuts,
    split by the model server into its sentences (none packed: the plan sets no deadline),
    each segment voiced once. The same every run, unlike under the `playback` plan, whose
    chunks (and so segments) follow the machine's speed."""
    from gateway.config import Settings as GatewaySettings
    from gateway.reply.plan.protocol import Chunk
    from gateway.reply.plan.sentence_plan import SentencePlan
    from gateway.service.replies import chunker_config
    from gateway.sources.echo import tokens
    from model_server.text.split import split_phonemes

    plan = SentencePlan(chunker_config(GatewaySettings()))
    chunks: list[str] = []

    def took(sent: list[Chunk]) -> None:  # each done at once: only the cuts matter here
        for chunk in sent:
            plan.completed(len(chunks), 0.0, 0.0)
            chunks.append(chunk.text)
        while plan.unsent:
            took(plan.tick(0.0))

    for token in tokens(text):
        took(plan.push(token, 0.0))
    took(plan.flush(0.0))
    return sum(
        expected_pcm_bytes(segment)
        for chunk in chunks
        for segment in split_phonemes(IdentityG2P()(chunk), FakeEngine.max_phonemes)
    )


class FakeProgressiveEngine(FakeEngine):
    """The fake engine in two passes, like the onnx engine's progressive ones: `front` (one
    frame per phoneme) and `decode` over any window of frames, which gives exactly those
    samples of the whole square wave. So the windows' audio, joined, is the whole call's, and
    a test can hold the decoder from its `hold_from`-th window on (until cancelled or `gate`)."""

    name = "fake-progressive"
    two_passes = True
    exact_windows = False  # its windows come with context, as the windows decoder's do

    def reset(self) -> None:
        super().reset()
        self.hold_from: int | None = None
        self.fronts: list[str] = []
        self.windows: list[tuple[int, int]] = []
        self.window_cancelled: list[tuple[int, int]] = []

    def front(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Front:
        self.fronts.append(phonemes)
        durations = np.array([0, *([1] * len(phonemes)), 0], np.int64)
        return Front(len(phonemes), durations, frame_samples(speed), phonemes)

    def prepare_voice(self, voice: str, pause: Pause) -> bool:
        """Nothing to make ahead: its windows need no prior."""
        return True

    def decode(self, front: Front, window: Window, cancel: CancelToken) -> FloatAudio:
        start, end = window.decoded
        index = len(self.windows)
        self.windows.append((start, end))
        if self.hold_from is not None and index >= self.hold_from:
            cancel.on_cancel(self.gate.set)
            self.entered.set()
            self.gate.wait(timeout=30)
            if cancel.cancelled:
                self.window_cancelled.append((start, end))
                self.cancel_seen.set()
                raise SynthesisCancelled()
        n = front.frame_samples
        samples = np.arange(start * n, end * n)
        return np.where((samples // 55) % 2 == 0, 0.5, -0.5).astype(np.float32)


@contextlib.contextmanager
def serve_fake(
    engine: FakeEngine, host: str = "127.0.0.1", port: int = 0, **settings: Any
) -> Iterator[RunningServer]:
    """The model server's real app and routes over `engine`, ready, at `host`:`port` (0: any
    free port), with `FAKE_SETTINGS` changed by `settings`."""
    app = create_app(
        dataclasses.replace(FAKE_SETTINGS, **settings),
        engine_factory=lambda _: engine,
        g2p_factory=identity_g2p,
    )
    with serve(app, host, port) as running:
        assert app.state.service.settled.wait(timeout=10)
        yield running
