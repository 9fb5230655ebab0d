"""A seam detector, pure: does audio joined from separately decoded windows click or jump in
level where the windows meet?

A click is a step between two samples: broadband energy in a few milliseconds. At each seam
the measures are taken in a short span around it and set against the same measures at every
other point of the clip (the clip's own speech is the yardstick, so loud or bright speech is
not mistaken for a seam):

- `jump`: the largest sample-to-sample step within `span_s` of the seam, over the 99.9th
  percentile of steps elsewhere (a hard cut between two decodings: 1.3-1.8; speech: below 1);
- `hf`: the high-frequency energy (the first difference, which rises 6 dB per octave) in the
  span around the seam over the 90th percentile of the same over spans of equal length
  elsewhere at a similar level (within 6 dB), and over the median of the spans just around it
  (`local_s` either side: a click is brighter than what surrounds it, a fricative is bright
  throughout; a seam in an /s/ measured 23 against the voiced spans of its level, with no
  millisecond around it brighter than the next), and over no less than `HF_FLOOR`: in a pause the
  spans of a similar level hold only the decoder's noise floor, 60 dB down, and seams there
  measured 3-6 times them over the quality corpus with peaks below 0.001 (a click in a pause
  is a step, which `jump` measures);
- `level_db`: the change in RMS level across the seam (`level_s` either side), in dB, against
  the 95th percentile of the same change at other points.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Samples = npt.NDArray[np.float32]

# the first difference's energy of a full-band signal 50 dB below full scale (an 8 kHz tone
# of amplitude 10^(-50/20) has about this much): HF below it is a pause's, whatever its ratio
HF_FLOOR = 2e-5


@dataclass(frozen=True)
class Seam:
    at: int  # sample
    jump: float
    hf: float
    level_db: float


@dataclass(frozen=True)
class SeamReport:
    seams: tuple[Seam, ...]

    @property
    def worst_jump(self) -> float:
        return max((s.jump for s in self.seams), default=0.0)

    @property
    def worst_hf(self) -> float:
        return max((s.hf for s in self.seams), default=0.0)

    @property
    def worst_level_db(self) -> float:
        return max((s.level_db for s in self.seams), default=0.0)


def _rms(x: Samples) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


def seams(
    audio: Samples,
    at: Sequence[int],
    rate: int = 24_000,
    span_s: float = 0.004,
    level_s: float = 0.02,
    local_s: float = 0.024,
) -> SeamReport:
    """Each seam of `audio` (at the sample indices `at`) measured against the rest."""
    x = np.asarray(audio, np.float64)
    steps = np.abs(np.diff(x))
    span = max(1, int(span_s * rate))
    width = max(1, int(level_s * rate))
    local = int(local_s * rate)
    near = np.zeros(steps.size, bool)
    for a in at:
        near[max(0, a - span) : a + span] = True
    elsewhere = steps[~near] if (~near).any() else steps
    typical_step = float(np.quantile(elsewhere, 0.999)) or 1e-9

    # energy of the first difference and the level, in spans of 2 x span, at every span
    starts = np.arange(0, steps.size - 2 * span, span)
    hf = np.array([np.mean(np.square(steps[s : s + 2 * span])) for s in starts])
    level = np.array([_rms(x[s : s + 2 * span].astype(np.float32)) for s in starts])
    seam_starts = {max(0, a - span) // span * span for a in at}
    others = np.array([s not in seam_starts for s in starts], bool)

    def level_change(a: int) -> float:
        before = _rms(x[max(0, a - width) : a].astype(np.float32))
        after = _rms(x[a : a + width].astype(np.float32))
        return float(abs(20 * np.log10((after + 1e-5) / (before + 1e-5))))

    probes = range(width, x.size - width, width)
    far = [p for p in probes if all(abs(p - a) > 2 * width for a in at)]
    typical_level = float(np.quantile([level_change(p) for p in far], 0.95)) if far else 1.0

    out = []
    for a in at:
        lo, hi = max(0, a - span), min(steps.size, a + span)
        jump = float(steps[lo:hi].max()) / typical_step if hi > lo else 0.0
        here_start = max(0, a - span)
        here_hf = float(np.mean(np.square(steps[here_start : here_start + 2 * span])))
        here_level = _rms(x[here_start : here_start + 2 * span].astype(np.float32))
        similar = others & (np.abs(20 * np.log10((level + 1e-5) / (here_level + 1e-5))) < 6)
        ref_hf = float(np.quantile(hf[similar] if similar.any() else hf, 0.9))
        # the spans around it that do not overlap its own
        distance = np.abs(starts - here_start)
        around = others & (distance >= 2 * span) & (distance <= local)
        local_hf = float(np.median(hf[around])) if around.any() else 0.0
        out.append(
            Seam(
                a,
                jump,
                here_hf / max(ref_hf, local_hf, HF_FLOOR),
                level_change(a) / typical_level,
            )
        )
    return SeamReport(tuple(out))
