"""Engines: `onnx` (CPU default, real Kokoro-82M int8 weights) and `torch` (KModel, GPU).

torch's OpenMP threads spin only briefly before they sleep while they wait for work
(`OMP_WAIT_POLICY` PASSIVE with `GOMP_SPINCOUNT` `SPIN_COUNT`, unless the environment names
either; libgomp reads them when torch loads it, which in the model server happens under this
package). A team that sleeps at once pays a wake-up per parallel region, hundreds per decoder
block, which slows the stream decoder markedly on a quiet CPU. One that spins for libgomp's
default (300,000 turns, a few ms) takes the cores from the threads it waits for on a busy
machine. The figures, quiet and busy, are in docs/measured.md ("2026-12-06 (evening): torch's
threads spin briefly, and main beside main before #48")."""

from __future__ import annotations

import os

# libgomp's turns of spinning before a waiting thread sleeps (its own estimate: about 100,000 a
# millisecond); libgomp's default is 300,000, PASSIVE alone 0
SPIN_COUNT = 20_000

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)

from model_server.engines.base import CancelToken, Engine, FloatAudio  # noqa: E402 (after the policy)

__all__ = ["CancelToken", "Engine", "FloatAudio"]
