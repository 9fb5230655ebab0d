"""A model server whose engine takes a GPU's time: the policy at a GPU's scale on any machine.

`make bench-load BENCH_ARGS="--simulate-gpu"` runs it in place of the real model server, so
the gateway, the scheduler, admission and the load generator are the real ones, with dozens
of conversations, on a machine without a GPU. Only the engine call is simulated: it sleeps
(the GIL free, as CUDA work leaves it) for the time measured for Kokoro-82M's torch engine
on one NVIDIA H200 (`scripts/gpu-check`, docs/measured.md): 40 ms + 0.37 ms per phoneme
alone (45 ms for "Hello there.", 97 ms for a 160-phoneme sentence, 0.10 s for the bench's
230-phoneme answer in one call), each call 15 % slower per other call running beside it (16
sessions on 4 workers took 435 ms for their first audio, against 72 ms alone). Its audio is a
tone of 3 frames (75 ms) per phoneme, as `tests.support.kokoro_checkpoint`'s full-size random
checkpoint gives (the real model: 2.6 on this answer). G2P is the real one.

    python -m bench.sim_engine --port 8080 [--workers 4] [--call-s 0.04] [--per-phoneme-s 0.00037]
"""

from __future__ import annotations

import argparse
import threading
import time

import numpy as np
import uvicorn

from model_server.app import create_app
from model_server.config import Settings
from model_server.engines.base import CancelToken, FloatAudio, Timed
from tests.support.kokoro_checkpoint import REAL_FRAMES_PER_TOKEN, SAMPLES_PER_FRAME


class SimulatedGpu:
    name = "simulated-gpu"
    max_phonemes = 510
    two_passes = False  # whole calls, at a GPU's measured speed
    voice_note = ""

    def __init__(self, call_s: float, per_phoneme_s: float, share: float) -> None:
        self.call_s, self.per_phoneme_s, self.share = call_s, per_phoneme_s, share
        self._running = 0
        self._lock = threading.Lock()

    @property
    def description(self) -> str:
        per_phoneme_ms = self.per_phoneme_s * 1000
        return f"simulated GPU: {self.call_s * 1000:.0f} ms + {per_phoneme_ms:.2f} ms/phoneme"

    def voices(self) -> dict[str, str]:
        return {"af_sim": "simulated"}

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        return self.infer_timed(phonemes, voice, speed, cancel).audio

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        with self._lock:
            beside = self._running
            self._running += 1
        try:
            seconds = (self.call_s + self.per_phoneme_s * len(phonemes)) * (1 + self.share * beside)
            time.sleep(seconds)
        finally:
            with self._lock:
                self._running -= 1
        frames = np.array([0, *([REAL_FRAMES_PER_TOKEN] * len(phonemes)), 0], np.int64)
        samples = int(frames.sum()) * SAMPLES_PER_FRAME
        audio = (0.3 * np.sin(np.arange(samples) * 2 * np.pi * 220 / 24_000)).astype(np.float32)
        return Timed(audio, frames, SAMPLES_PER_FRAME)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--scheduling", default="edf")
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--call-s", type=float, default=0.04)
    parser.add_argument("--per-phoneme-s", type=float, default=0.00037)
    parser.add_argument("--share", type=float, default=0.15)
    args, _ = parser.parse_known_args()  # the real model server's other flags: not used here
    engine = SimulatedGpu(args.call_s, args.per_phoneme_s, args.share)
    settings = Settings(workers=args.workers, scheduling=args.scheduling, default_voice="af_sim")
    app = create_app(settings, engine_factory=lambda _: engine)
    print(f"model-server: {engine.description}, {args.workers} workers", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
