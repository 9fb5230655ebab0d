"""Engines: `onnx` (CPU default, real Kokoro-82M int8 weights) and `torch` (KModel, GPU).

torch's OpenMP threads spin only briefly before they sleep while they wait for work
(`OMP_WAIT_POLICY` PASSIVE with `GOMP_SPINCOUNT` `SPIN_COUNT`, unless the environment names
either; libgomp reads them when torch loads it, which in the model server happens under this
package). A team that sleeps at once pays a wake-up per parallel region, hundreds per decoder
block; one that spins for libgomp's default (300,000 turns, a few ms) takes the cores from the
threads it waits for on a busy machine. Measured on 2 cores (docs/measured.md, 2026-12-06,
evening): quiet, a short spin is as fast as the default's (the whole answer 3.7 s against 4.7-5.4
s sleeping at once, first audio 1.0 s against 1.6-1.7 s); beside two busy processes it is as good
as sleeping at once, where the default's spin stretched the answer to 24 s."""

from __future__ import annotations

import os

# libgomp's turns of spinning before a waiting thread sleeps (its own estimate: about 100,000 a
# millisecond); libgomp's default is 300,000, PASSIVE alone 0
SPIN_COUNT = 5000

if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)

from model_server.engines.base import CancelToken, Engine, FloatAudio  # noqa: E402 (after the policy)

__all__ = ["CancelToken", "Engine", "FloatAudio"]
