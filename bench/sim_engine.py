"""A model server whose engine takes a GPU's measured time: the policy at a GPU's scale on any
machine.

`make bench-load BENCH_ARGS="--simulate-gpu"` runs it in place of the real model server, so
the gateway, the scheduler, admission and the load generator are the real ones, with dozens
of conversations, on a machine without a GPU. Only the engine call is simulated: it sleeps
(the GIL free, as CUDA work leaves it) for the time a measured curve gives (`--curve`, a JSON
file; `Curve`): a call alone `seconds_per_call` + `seconds_per_phoneme` per phoneme, each call
`beside` slower per other call running with it; with `--batch on` and a measured
`batch_curve` (`scripts/gpu-check`'s batch step writes one, `bench_batch --curve-out`), the
decoder's part of each call (`batch_curve`'s seconds per frame alone, times its frames) as
its row of a batch of the calls running at once, and `GET /load` publishes that curve, so
admission counts capacity in batches as it does on the device. The default curve is the one
H200 run (`bench/curves/h200-2026-11-30.json`, docs/measured.md): 40 ms + 0.37 ms per phoneme
alone, 15 % slower per call beside it, no batch curve. Its audio is a tone of 3 frames (75 ms)
per phoneme, as `tests.support.kokoro_checkpoint`'s full-size random checkpoint gives (the real
model: 2.6 on the bench's answer). G2P is the real one.

    python -m bench.sim_engine --port 8080 [--workers 4] [--curve FILE] [--batch on]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import uvicorn

from kokoro_contract import capacity
from kokoro_contract.load import FRAME_S, MalformedLoadReport, batch_curve_from_json
from model_server.app import create_app
from model_server.config import Settings
from model_server.engines.base import CancelToken, FloatAudio, Timed
from tests.support.kokoro_checkpoint import REAL_FRAMES_PER_TOKEN, SAMPLES_PER_FRAME

DEFAULT_CURVE = Path(__file__).parent / "curves" / "h200-2026-11-30.json"


@dataclass(frozen=True)
class Curve:
    """A device's measured speed, as the simulated engine takes it (module docstring)."""

    source: str  # where it was measured, said with every run
    seconds_per_call: float
    seconds_per_phoneme: float
    beside: float  # each call this much slower per other call running with it
    batch_curve: dict[int, float] | None  # the decoder's seconds per frame by batch size

    @classmethod
    def load(cls, path: Path) -> Curve:
        """The curve a file holds; `ValueError` naming what is wrong."""
        body: Any = json.loads(path.read_text())
        if not isinstance(body, dict) or not isinstance(body.get("source"), str):
            raise ValueError(f"{path}: a curve is a JSON object with its source")
        try:
            call, per_phoneme = float(body["seconds_per_call"]), float(body["seconds_per_phoneme"])
            beside = float(body.get("beside", 0.0))
            curve = batch_curve_from_json(body.get("batch_curve"))
        except (KeyError, TypeError, ValueError, MalformedLoadReport) as exc:
            raise ValueError(f"{path}: not a curve: {exc}") from exc
        if min(call, per_phoneme, beside) < 0:
            raise ValueError(f"{path}: a curve's seconds are not negative")
        return cls(body["source"], call, per_phoneme, beside, capacity.curve_of(curve))

    def call_s(self, phonemes: int, frames: int, at_once: int, batched: bool) -> float:
        """A call of `phonemes` giving `frames` frames while `at_once` calls run (it too)."""
        alone = self.seconds_per_call + self.seconds_per_phoneme * phonemes
        beside = 1 + self.beside * (at_once - 1)
        decoder = capacity.decoder_speech_s(self.batch_curve) * frames * FRAME_S
        if not batched or self.batch_curve is None or decoder <= 0:
            return alone * beside
        decoder = min(decoder, alone)
        share = capacity.row_share(self.batch_curve, at_once)
        return (alone - decoder) * beside + decoder * share * at_once


class SimulatedGpu:
    name = "simulated-gpu"
    max_phonemes = 510
    two_passes = False  # whole calls, at a GPU's measured speed
    voice_note = ""

    def __init__(self, curve: Curve, batched: bool) -> None:
        self.curve, self.batched = curve, batched
        self._running = 0
        self._lock = threading.Lock()

    @property
    def description(self) -> str:
        c = self.curve
        batch = ", decoder steps batched by its curve" if self.batched and c.batch_curve else ""
        return (
            f"simulated engine: {c.seconds_per_call * 1000:.0f} ms + "
            f"{c.seconds_per_phoneme * 1000:.2f} ms/phoneme, {c.beside:.0%} slower per call "
            f"beside it{batch} (curve: {c.source})"
        )

    def batch_curve(self) -> dict[str, float] | None:
        """`GET /load`'s `batch_curve`: the measured one, with `--batch on`."""
        if not self.batched or self.curve.batch_curve is None:
            return None
        return {str(n): v for n, v in sorted(self.curve.batch_curve.items())}

    def voices(self) -> dict[str, str]:
        return {"af_sim": "simulated"}

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        return self.infer_timed(phonemes, voice, speed, cancel).audio

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        frames = np.array([0, *([REAL_FRAMES_PER_TOKEN] * len(phonemes)), 0], np.int64)
        with self._lock:
            self._running += 1
            at_once = self._running
        try:
            time.sleep(self.curve.call_s(len(phonemes), int(frames.sum()), at_once, self.batched))
        finally:
            with self._lock:
                self._running -= 1
        samples = int(frames.sum()) * SAMPLES_PER_FRAME
        audio = (0.3 * np.sin(np.arange(samples) * 2 * np.pi * 220 / 24_000)).astype(np.float32)
        return Timed(audio, frames, SAMPLES_PER_FRAME)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--scheduling", default="edf")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--curve", type=Path, default=DEFAULT_CURVE, help="a measured curve")
    parser.add_argument("--batch", choices=("on", "off"), default="off")
    args, _ = parser.parse_known_args()  # the real model server's other flags: not used here
    engine = SimulatedGpu(Curve.load(args.curve), batched=args.batch == "on")
    settings = Settings(workers=args.workers, scheduling=args.scheduling, default_voice="af_sim")
    app = create_app(settings, engine_factory=lambda _: engine)
    print(f"model-server: {engine.description}, {args.workers} workers", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
