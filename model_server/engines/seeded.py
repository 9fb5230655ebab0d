"""The torch engine's harmonic source, seeded per segment: the same request gives the same
samples, however often it is sent and whatever else the server computes meanwhile.

Kokoro's harmonic source (`SineGen` under the generator's `m_source`) draws its initial phases
and its noise from torch's global generators, the only random numbers an evaluating KModel
draws. `SeededSource` stands in for it: while a thread is inside `seeded(seed)`, the source's
draws come from generators forked from the global ones and seeded with `seed`, one source at a
time in the process (one lock for every source and every draw, seeded or not: the generators
are the process's, so another engine's source drawing meanwhile, e.g. a whole call of a prior's
calibration whose source is replaced after it is drawn, would take numbers from the seeded
fork or seed it again), and the global generators are as they were after it; outside, it is
kokoro's own. `segment_seed` derives the seed from what the segment is (its
tokens, voice and speed), so a whole call and a front pass of the same segment draw the same
numbers."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn


def segment_seed(tokens: Sequence[int], voice: str, speed: float) -> int:
    """A seed for the segment: 63 bits of the hash of what it is."""
    text = f"{voice}\n{speed!r}\n{','.join(map(str, tokens))}"
    digest = hashlib.sha256(text.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


# held while a source's draws are seeded: torch's global generators are one per process
_GLOBAL_GENERATORS = threading.Lock()


class SeededSource(nn.Module):  # type: ignore[misc]
    """`source` (a generator's `m_source`), its draws seeded where the thread asks."""

    def __init__(self, source: nn.Module, devices: list[int]) -> None:
        super().__init__()
        self.source = source
        self._devices = devices  # the CUDA devices whose generators are forked too
        self._local = threading.local()

    @contextmanager
    def seeded(self, seed: int) -> Iterator[None]:
        """The source's draws on this thread from `seed`, inside the block."""
        self._local.seed = seed
        try:
            yield
        finally:
            self._local.seed = None

    def forward(self, x: Any) -> Any:
        seed = getattr(self._local, "seed", None)
        with _GLOBAL_GENERATORS:  # unseeded draws too: they would take numbers from a seeded fork
            if seed is None:
                return self.source(x)
            with torch.random.fork_rng(devices=self._devices):
                torch.manual_seed(seed)
                return self.source(x)


def seed_source(generator: nn.Module, devices: list[int]) -> SeededSource:
    """`generator`'s `m_source` replaced by a `SeededSource` over it (done once, at load)."""
    seeded = SeededSource(generator.m_source, devices)
    generator.m_source = seeded
    return seeded
