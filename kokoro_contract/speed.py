"""How long synthesis takes, learned as it runs, pure: seconds = a + b x size.

A least-squares line over recent observations, each weighing a little less than the one after
it, so the estimate follows the machine's real speed (including the slowdown when calls run side
by side). Until enough have been seen, a prior holds the line. The model server learns seconds
per engine call from phoneme counts; the gateway learns seconds per chunk from characters,
as the model server's `synthesis_complete` reports them (queueing included)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpeedModel:
    prior_a: float = 0.35  # seconds per call (int8 ONNX, 2 cores)
    prior_b: float = 0.028  # seconds per unit of size (a phoneme token)
    prior_weight: float = 3.0  # the prior counts as this many calls
    decay: float = 0.95  # each new call scales the weight of the older ones by this

    def __post_init__(self) -> None:
        self._w = self._wn = self._wnn = self._wt = self._wnt = 0.0
        # the prior as two pseudo-observations on its own line (20 and 200 phonemes)
        for n in (20.0, 200.0):
            self._add(n, self.prior_a + self.prior_b * n, self.prior_weight / 2)
        self.calls = 0

    def _add(self, n: float, t: float, w: float) -> None:
        self._w += w
        self._wn += w * n
        self._wnn += w * n * n
        self._wt += w * t
        self._wnt += w * n * t

    def observe(self, size: float, seconds: float) -> None:
        for name in ("_w", "_wn", "_wnn", "_wt", "_wnt"):
            setattr(self, name, getattr(self, name) * self.decay)
        self._add(float(size), seconds, 1.0)
        self.calls += 1

    @property
    def line(self) -> tuple[float, float]:
        """(a, b): seconds per call and per unit of size, both kept non-negative."""
        var = self._w * self._wnn - self._wn**2
        if var <= 1e-9:
            return self.prior_a, self.prior_b
        b = max(0.0, (self._w * self._wnt - self._wn * self._wt) / var)
        a = max(0.0, (self._wt - b * self._wn) / self._w)
        return a, b

    def estimate(self, size: float) -> float:
        a, b = self.line
        return a + b * size
