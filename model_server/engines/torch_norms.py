"""The torch engine's instance norms, carried from window to window of a segment.

The same statistics as the onnx engine's (`carried_norms`, whose docstring says why), for the
`kokoro` package's modules: every `nn.InstanceNorm1d` of the decoder (each `AdaIN1d`'s `norm`,
in `AdainResBlk1d` and `AdaINResBlock1`) is replaced once, at load, by a `CarriedInstanceNorm`,
numbered in module traversal order. With no decoder pass active on the calling thread it is
the `InstanceNorm1d` it replaced (the same function on the same tensors: the whole call's audio
sample for sample). Inside `carrying(run)` it reads the sums carried in for its number from
`run` and normalises by

    m = (S + n * mean_w) / (N + n),  var = (n * E_w[(x - m)^2] + Q - 2 m S + N m^2) / (N + n)

(`S`, `Q`, `N`: the sums of the activations, of their squares, and their count carried in, at
this norm's rate; `n` the window's length there), and records the sums over the window's core
(frames `[left, left + core)` of the decoded window, mapped to the norm's rate by length ratio)
for the next window. The active pass is thread-local: the engine decodes several segments at
once, on different threads (and CUDA streams), and nothing mutable is shared between calls.

`Carried` is `NormStats` on the device (float64, so the sums of a long segment keep their
precision where the variance subtracts them); priors go to and from disk as `NormStats`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from model_server.engines.carried_norms import NormStats

_active = threading.local()  # .run: the decoder pass of this thread, if any


@dataclass(frozen=True)
class Carried:
    """Each norm's sums of its activations and of their squares over `frames` frames, as
    (1, channels, 1) float64 tensors on the engine's device."""

    sums: tuple[Any, ...]
    squares: tuple[Any, ...]
    frames: float

    @classmethod
    def from_stats(cls, stats: NormStats, device: Any) -> Carried:
        def put(arrays: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(torch.from_numpy(np.asarray(a, np.float64)).to(device) for a in arrays)

        return cls(put(stats.sums), put(stats.squares), stats.frames)

    def to_stats(self) -> NormStats:
        def get(tensors: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(t.cpu().numpy().astype(np.float32) for t in tensors)

        return NormStats(get(self.sums), get(self.squares), self.frames)

    def plus(self, other: Carried) -> Carried:
        return Carried(
            tuple(a + b for a, b in zip(self.sums, other.sums, strict=True)),
            tuple(a + b for a, b in zip(self.squares, other.squares, strict=True)),
            self.frames + other.frames,
        )

    def scaled(self, frames: float) -> Carried:
        """The same statistics, weighing as much as `frames` frames."""
        f = frames / self.frames
        return Carried(tuple(a * f for a in self.sums), tuple(a * f for a in self.squares), frames)


@dataclass
class Run:
    """One decoder pass over a window of `frames` frames: the statistics carried in (None:
    each norm its window's own, as `InstanceNorm1d`), where its core lies, and the core's sums
    each norm records (by its number)."""

    carried: Carried | None
    frames: int
    core_left: int
    core_frames: int
    norms: int
    sums: list[Any] = field(default_factory=list)
    squares: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sums = [None] * self.norms
        self.squares = [None] * self.norms

    def moved(self, frames: int, core_left: int) -> Run:
        """The same pass over another span of frames (the generator's, after the body's): its
        norms read the same statistics and record into the same sums."""
        run = Run(self.carried, frames, core_left, self.core_frames, self.norms)
        run.sums, run.squares = self.sums, self.squares
        return run

    def core(self) -> Carried:
        """The sums over the window's core that every norm recorded."""
        missing = [k for k, s in enumerate(self.sums) if s is None]
        if missing:
            raise RuntimeError(f"norms {missing} did not run in this decoder pass")
        return Carried(tuple(self.sums), tuple(self.squares), float(self.core_frames))


@contextmanager
def carrying(run: Run) -> Iterator[Run]:
    """The decoder's norms on this thread read and record `run` inside this block."""
    before = getattr(_active, "run", None)
    _active.run = run
    try:
        yield run
    finally:
        _active.run = before


class CarriedInstanceNorm(nn.InstanceNorm1d):  # type: ignore[misc]
    """`InstanceNorm1d` (no running statistics) that, inside `carrying`, normalises by the
    statistics carried in for its `index` and records its window's core sums."""

    def __init__(self, original: Any, index: int) -> None:
        super().__init__(
            original.num_features,
            eps=original.eps,
            momentum=original.momentum,
            affine=original.affine,
            track_running_stats=False,
            device=original.weight.device if original.affine else None,
            dtype=original.weight.dtype if original.affine else None,
        )
        if original.affine:
            self.load_state_dict(original.state_dict())
        self.index = index

    def forward(self, x: Any) -> Any:
        run: Run | None = getattr(_active, "run", None)
        if run is None or x.dim() != 3:
            return super().forward(x)
        n = x.shape[-1]
        rate = n / run.frames
        k = self.index
        start = round(run.core_left * rate)
        core = x[..., start : round((run.core_left + run.core_frames) * rate)]
        run.sums[k] = core.sum(-1, keepdim=True).double()
        run.squares[k] = (core * core).sum(-1, keepdim=True).double()
        carried = run.carried
        if carried is None or carried.frames <= 0:
            return super().forward(x)  # the window's own statistics, exactly
        s, q = carried.sums[k], carried.squares[k]
        carried_n = carried.frames * rate
        total = carried_n + n
        mean = (s + x.sum(-1, keepdim=True).double()) / total
        centred = x - mean.to(x.dtype)
        window_sq = (centred * centred).sum(-1, keepdim=True).double()
        variance = (window_sq + q - 2 * mean * s + carried_n * mean * mean) / total
        out = centred * torch.rsqrt(variance.clamp(min=0).to(x.dtype) + self.eps)
        if self.affine:
            out = out * self.weight.view(1, -1, 1) + self.bias.view(1, -1, 1)
        return out


def carry_statistics(module: Any) -> int:
    """Replace every `InstanceNorm1d` under `module` (in traversal order) by a
    `CarriedInstanceNorm` numbered in that order; returns how many. `ValueError` when there is
    none, or one that keeps running statistics (not an instance norm over the window)."""
    found = [
        (name, m)
        for name, m in module.named_modules()
        if isinstance(m, nn.InstanceNorm1d) and not isinstance(m, CarriedInstanceNorm)
    ]
    if not found:
        raise ValueError("no instance norm to carry statistics through")
    for index, (name, norm) in enumerate(found):
        if norm.track_running_stats:
            raise ValueError(f"{name} keeps running statistics")
        parent_name, _, attr = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, attr, CarriedInstanceNorm(norm, index))
    return len(found)
