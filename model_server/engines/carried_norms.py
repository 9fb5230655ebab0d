"""Progressive synthesis's instance norms, carried from window to window of a segment.

Kokoro's decoder normalises its activations 54 times (AdaIN: each channel's mean and variance
over time, then the style's scale and shift). Over a window of frames those statistics are the
window's, not the segment's, so every window's level and spectrum drift from one call's: the
main reason windows were heard worse than one call (docs/measured.md, "Progressive synthesis").
Here each norm takes its statistics from the frames decoded so far instead: the cores of the
segment's earlier windows, this window's frames, and a *prior*: the voice's statistics over a
reference text (`CALIBRATION_PHONEMES`), standing in for the frames still to come after the
window and weighing as many as they are, at most `PRIOR_FRAMES`. So even the first window, too
short to speak for the segment, is normalised near what the whole segment would give it, and the
last is normalised by the whole segment's own statistics, as one call is (with a fixed weight
the prior outweighed a short segment, whose end then came out quieter than one call's and was
trimmed shorter: docs/measured.md, "2026-12-01 (night)").

The onnx graphs' norms take the carried sums as inputs (`norm_graph`, which rewrites them);
the torch decoder's take them from `torch_norms`. `NormStats` holds those sums.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Self, overload

import numpy as np
import numpy.typing as npt

from model_server.engines.norm_graph import (
    PRIOR,
    squares_input,
    squares_output,
    sum_input,
    sum_output,
)

if TYPE_CHECKING:
    from model_server.engines.base import Pause
    from model_server.engines.streamed import StreamPriors

log = logging.getLogger(__name__)

PRIOR_FRAMES = 96.0  # how much the voice's reference statistics weigh, in frames
# Two sentences of reference speech (espeak-ng's phonemes; about 11 s at speed 1), not in the
# quality corpus: with their statistics as the prior the corpus's windows were heard nearly as
# one call, and clearly worse with nothing but the segment's own frames or each window's own
# (docs/measured.md, "2026-12-01 (evening)").
CALIBRATION_PHONEMES = (
    "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ nˌɪɹ ðə ɹˈɪvəɹ bˈæŋk.",
    "wʊd ju lˈIk mˌi tə swˈɪʧ jʊɹ əkˈWnt tə ðɪ ˈænjuᵊl plˈæn tədˈA, ɔɹ kˈip ðə mˈʌnθli wˌʌn?",
)

Array = npt.NDArray[np.float32]


@dataclass(frozen=True)
class NormStats:
    """Each norm's sums of its activations and of their squares over `frames` frames."""

    sums: tuple[Array, ...]
    squares: tuple[Array, ...]
    frames: float

    @classmethod
    def none(cls, norms: int) -> NormStats:
        zero = np.zeros((1, 1, 1), np.float32)
        return cls((zero,) * norms, (zero,) * norms, 0.0)

    @classmethod
    def from_outputs(cls, outputs: dict[str, Any], norms: int, frames: float) -> NormStats:
        """From the runs' outputs by name: each norm's core sums (`sum_output`,
        `squares_output`), whichever part of the decoder gave them."""
        sums = tuple(np.asarray(outputs[sum_output(k)], np.float32) for k in range(norms))
        squares = tuple(np.asarray(outputs[squares_output(k)], np.float32) for k in range(norms))
        return cls(sums, squares, frames)

    def plus(self, other: NormStats) -> NormStats:
        return NormStats(
            tuple(a + b for a, b in zip(self.sums, other.sums, strict=True)),
            tuple(a + b for a, b in zip(self.squares, other.squares, strict=True)),
            self.frames + other.frames,
        )

    def scaled(self, frames: float) -> NormStats:
        """The same statistics, weighing as much as `frames` frames."""
        if self.frames <= 0:
            raise ValueError("no frames to scale")
        f = np.float32(frames / self.frames)
        return NormStats(
            tuple(a * f for a in self.sums), tuple(a * f for a in self.squares), frames
        )

    def feed(self) -> dict[str, Any]:
        feed: dict[str, Any] = {PRIOR: np.array([self.frames], np.float32)}
        for k, (s, q) in enumerate(zip(self.sums, self.squares, strict=True)):
            feed[sum_input(k)] = s
            feed[squares_input(k)] = q
        return feed

    def save(self, path: Path) -> None:
        arrays = {f"s{k}": a for k, a in enumerate(self.sums)}
        arrays |= {f"q{k}": a for k, a in enumerate(self.squares)}
        tmp = path.with_name(path.name + ".part")
        with tmp.open("wb") as f:
            np.savez(f, frames=np.array(self.frames), **arrays)  # type: ignore[arg-type]
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path, norms: int) -> NormStats | None:
        """The statistics saved at `path`, or None when there are none (or not of `norms`)."""
        try:
            with np.load(path) as data:
                if f"s{norms}" in data.files:  # more norms than this graph has
                    return None
                sums = tuple(data[f"s{k}"].astype(np.float32) for k in range(norms))
                squares = tuple(data[f"q{k}"].astype(np.float32) for k in range(norms))
                frames = float(data["frames"])
        except (OSError, KeyError, ValueError, EOFError):
            return None
        return cls(sums, squares, frames) if frames > 0 else None


class Sums(Protocol):
    """Norm statistics that add up and scale: `NormStats`, and the torch engine's
    `torch_norms.Carried` (the same sums as tensors on its device)."""

    @property
    def frames(self) -> float: ...

    def plus(self, other: Self) -> Self: ...

    def scaled(self, frames: float) -> Self: ...


@overload
def carried_in[S: Sums](prior: S | None, seen: S, after: int) -> S: ...
@overload
def carried_in[S: Sums](prior: S | None, seen: None, after: int) -> S | None: ...
def carried_in[S: Sums](prior: S | None, seen: S | None, after: int) -> S | None:
    """The statistics a window is normalised by, beside its own core's: `seen`, those of the
    segment's cores before it, and the voice's `prior`, standing in for the `after` frames
    still to come after the window and weighing as many as they are, at most its own weight.
    So the last window is normalised by the whole segment's statistics, as one call is. The
    one rule for every engine that carries norms; None: nothing to carry (each norm its
    window's own)."""
    weight = 0.0 if prior is None else max(0.0, min(prior.frames, float(after)))
    if prior is None or weight <= 0:
        return seen
    scaled = prior.scaled(weight)
    return scaled if seen is None else scaled.plus(seen)


def blended_stats(parts: list[tuple[NormStats, float]]) -> NormStats:
    """A voice blend's prior from its voices' (each with its share, the shares summing to 1),
    for the windows decoder: their sums pooled as if each had given its share of the frames,
    weighing what the first weighs (every prior of one engine weighs the same). The sums do not
    say over how many steps each norm summed (its layer's rate), so the streamed decoder's rule
    (`streamed.blended`: each mean and variance weighted, from its statistics) cannot be read
    from them; pooled, the windows decoder's blend was heard as its loaded voices' were
    (docs/measured.md, "Voice blends")."""
    frames = parts[0][0].frames
    pooled = parts[0][0].scaled(frames * parts[0][1])
    for stats, share in parts[1:]:
        pooled = pooled.plus(stats.scaled(frames * share))
    return pooled


def voice_prior(
    directory: Path,
    voice: str,
    model_key: str,
    pack: npt.NDArray[Any],
    norms: int,
    calibrate: Callable[[], NormStats],
) -> NormStats:
    """The voice's statistics over the reference text: read from `directory` when they were
    kept there for this model (`model_key`), this voice pack and this text, else `calibrate()`d
    and kept (a read-only directory: computed again at the next start). Unscaled."""
    key = hashlib.sha256(
        "\n".join([model_key, *CALIBRATION_PHONEMES]).encode()
        + np.ascontiguousarray(pack).tobytes()
    ).hexdigest()[:24]
    path = directory / f"{voice}.{key}.npz"
    stats = NormStats.load(path, norms)
    if stats is not None:
        return stats
    started = time.perf_counter()
    stats = calibrate()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        stats.save(path)
    except OSError as exc:
        log.warning("could not keep the norm prior of %s: %s", voice, exc)
    log.info(
        "instance-norm prior of %s over %.0f frames in %.1f s",
        voice,
        stats.frames,
        time.perf_counter() - started,
    )
    return stats


def prepare_voice(
    voice: str,
    pause: Pause,
    streamed: StreamPriors | None,
    windows: Callable[[str], object] | None,
) -> bool:
    """Both engines' `ProgressiveEngine.prepare_voice`: `voice`'s priors made ahead of its first
    segment, the streamed decoder's (`streamed`) by length, a whole call at a time, else the
    windows decoder's (`windows(voice)`, one pass after one pause); None of either: nothing to
    make. False: it gave way to a segment waiting for another voice's."""
    if streamed is not None:
        return streamed.prepare(voice, pause)
    if windows is not None:
        pause(lambda: False)
        windows(voice)
    return True
