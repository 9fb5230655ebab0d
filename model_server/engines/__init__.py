"""Engines: `onnx` (CPU default, real Kokoro-82M int8 weights) and `torch` (KModel, GPU).

torch's OpenMP threads sleep while they wait for work rather than spin (`OMP_WAIT_POLICY`
PASSIVE, unless the environment says otherwise; libgomp reads it when torch loads it, which in
the model server happens under this package), as the onnx engine's threads do
(`OnnxOptions.spinning`): on a busy machine a spinning team takes the cores from the threads it
waits for. Measured through the gateway on 2 cores with other work running (docs/measured.md,
2026-12-06, afternoon): the answer given at once took 86 s and then failed (`tts_timeout`) with
the threads spinning, 7-13 s with them sleeping."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from model_server.engines.base import CancelToken, Engine, FloatAudio

__all__ = ["CancelToken", "Engine", "FloatAudio"]
