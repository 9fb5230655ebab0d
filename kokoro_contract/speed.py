"""How long synthesis takes, learned as it runs, pure: seconds = a + b x size.

A least-squares line over recent observations, each weighing a little less than the one after
it, so the estimate follows the machine's real speed (including the slowdown when calls run side
by side). Before any is seen, a prior line holds (the int8 ONNX engine on 2 cores); from the
first one on, the prior only gives the line's shape, scaled to the speed seen, until the sizes
seen spread enough to fit a line of their own. So a machine many times faster than the prior
(a GPU) is known after one call, not after dozens: a prior counted as observations would weigh
on the slope long after, from sizes no call has had (docs/measured.md, "Torch engine on a
GPU"). The model server learns seconds per engine call from phoneme counts; the gateway learns
seconds per chunk from characters, as the model server's `synthesis_complete` reports them
(queueing included)."""

from __future__ import annotations

from dataclasses import dataclass

# The priors, both the int8 ONNX engine on 2 cores: the model server's line, seconds per engine
# call against its phoneme tokens, and the gateway's, seconds per chunk against its characters
# as the model server reports them, queueing included, chosen from what a short and a long chunk
# took through the stack (docs/measured.md, "Conversations at once (`make bench-load`)")
PRIOR_SECONDS_PER_CALL = 0.35
PRIOR_SECONDS_PER_PHONEME = 0.028
PRIOR_SECONDS_PER_CHARACTER = 0.032


@dataclass
class SpeedModel:
    prior_a: float = PRIOR_SECONDS_PER_CALL  # seconds per call
    prior_b: float = PRIOR_SECONDS_PER_PHONEME  # seconds per unit of size
    decay: float = 0.95  # each new call scales the weight of the older ones by this
    # a line of its own once the sizes seen spread this much (standard deviation over mean);
    # before that, the prior's line scaled to the speed seen
    min_spread: float = 0.25

    def __post_init__(self) -> None:
        # weighted sums of the observations: w, w n, w n^2, w t, w n t, and w x the prior's
        # estimate of each (the speed seen against the prior's)
        self._w = self._wn = self._wnn = self._wt = self._wnt = self._wp = 0.0
        self.calls = 0

    def observe(self, size: float, seconds: float) -> None:
        for name in ("_w", "_wn", "_wnn", "_wt", "_wnt", "_wp"):
            setattr(self, name, getattr(self, name) * self.decay)
        n = float(size)
        self._w += 1.0
        self._wn += n
        self._wnn += n * n
        self._wt += seconds
        self._wnt += n * seconds
        self._wp += self.prior_a + self.prior_b * n
        self.calls += 1

    @property
    def line(self) -> tuple[float, float]:
        """(a, b): seconds per call and per unit of size, both kept non-negative."""
        if self._w <= 0 or self._wp <= 0:
            return self.prior_a, self.prior_b
        mean_n, mean_t = self._wn / self._w, self._wt / self._w
        var = self._wnn / self._w - mean_n**2
        if var <= (self.min_spread * mean_n) ** 2:
            scale = self._wt / self._wp
            return self.prior_a * scale, self.prior_b * scale
        b = (self._wnt / self._w - mean_n * mean_t) / var
        if b < 0:  # noise on a flat line
            return mean_t, 0.0
        a = mean_t - b * mean_n
        if a < 0:  # through the origin instead
            return 0.0, self._wnt / self._wnn
        return a, b

    def estimate(self, size: float) -> float:
        a, b = self.line
        return a + b * size
