"""`make soak`, the pure part: the duration, what each service's `/metrics` says, what counts
as unexpected, the verdict against the goal, and the table. No I/O (`bench/soak.py` has it).

The goal, over a run of `duration` with a sample every 10 s:

- **no unexpected error**: nothing a client saw was a 5xx other than `503 overloaded`, an
  `internal_error`, a traceback in a response, a WebSocket closed with 1011 or no answer at
  all (a hang); no bad request was answered other than as it should be; no error code outside
  the expected ones (refusals and the provoked bad requests) rose in `gateway_errors_total`;
  no ERROR line or traceback in either service's log during the run.
- **the load ran**: at least one reply served to the end per minute of run (a stack that
  refuses everything would pass the other checks without being soaked).
- **memory**: warm-up is the first 2 minutes, or the first 20 % of a shorter run (under
  10 minutes). The *baseline* is the first 3 samples after warm-up, the *end* the last 3
  samples; each service's RSS median at the end is at most 5 % above its median at baseline.
- **flat**: for each service, the median of the end's open descriptors, asyncio tasks and
  threads is at most the maximum seen up to the end of the baseline plus a small tolerance
  (descriptors +8, tasks +16, threads +2): what load alone makes them swing by.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

MIB = 1 << 20
REFUSAL_CODES = frozenset({"overloaded", "rate_limited", "too_many_sessions"})
SERVICES = ("gateway", "model_server")
GAUGES = ("rss_bytes", "fds", "tasks", "threads")
FAMILIES = {  # gauge -> the metric family both services expose
    "rss_bytes": "process_resident_memory_bytes",
    "fds": "process_open_fds",
    "tasks": "asyncio_tasks",
    "threads": "python_threads",
}

_PART = re.compile(r"(\d+(?:\.\d+)?)([smh])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str) -> float:
    """`90s`, `30m`, `2h`, `1h30m` -> seconds."""
    spec = text.strip().lower()
    parts = _PART.findall(spec)
    if not spec or "".join(n + u for n, u in parts) != spec:
        raise ValueError(f"duration {text!r}: give a number with a unit, e.g. 90s, 30m, 2h, 1h30m")
    seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if seconds <= 0:
        raise ValueError(f"duration {text!r} is not positive")
    return seconds


# --- what a service reports --------------------------------------------------------------------


@dataclass(frozen=True)
class ServiceSample:
    rss_bytes: float
    fds: float
    tasks: float
    threads: float
    errors: Mapping[str, float] = field(default_factory=dict)  # cumulative, by code
    deadline_misses: float = 0.0  # the model server's (information, not an error)

    def gauge(self, name: str) -> float:
        value: float = getattr(self, name)
        return value


@dataclass(frozen=True)
class Sample:
    t_s: float  # since the start of the load
    gateway: ServiceSample
    model_server: ServiceSample

    def of(self, service: str) -> ServiceSample:
        sample: ServiceSample = getattr(self, service)
        return sample


def read_metrics(text: str) -> ServiceSample:
    """One service's `/metrics` text: the four runtime gauges (NaN when missing), its errors by
    code (`gateway_errors_total`) and deadline misses (`model_server_deadline_misses`)."""
    values: dict[str, float] = {}
    errors: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_errors_total":
                errors[sample.labels.get("code", "")] = sample.value
            elif not sample.labels:
                values[sample.name] = sample.value
    gauges = {g: values.get(name, math.nan) for g, name in FAMILIES.items()}
    misses = values.get(
        "model_server_deadline_misses", values.get("model_server_deadline_misses_total", 0.0)
    )
    return ServiceSample(**gauges, errors=errors, deadline_misses=misses)


# --- outcomes ------------------------------------------------------------------------------------


def is_refusal(status: int | None, code: str | None) -> bool:
    """Refused because of load: expected, not an error."""
    return status == 429 or code in REFUSAL_CODES


def unexpected(
    status: int | None = None,
    code: str | None = None,
    close_code: int | None = None,
    text: str = "",
) -> str | None:
    """Why an answer is an unexpected error, or None when it is not one."""
    if close_code == 1011:
        return "WebSocket closed with 1011"
    if "Traceback (most recent call last)" in text:
        return "traceback in a response"
    if code == "internal_error":
        return "internal_error"
    if status is not None and status >= 500 and not is_refusal(status, code):
        return f"HTTP {status} {code or ''}".rstrip()
    return None


def new_error_codes(
    first: Mapping[str, float], last: Mapping[str, float], expected: Iterable[str]
) -> dict[str, int]:
    """Codes outside `expected` whose count rose between two samples of `gateway_errors_total`."""
    allowed = set(expected)
    rose = {code: int(n - first.get(code, 0.0)) for code, n in last.items()}
    return {code: n for code, n in sorted(rose.items()) if n > 0 and code not in allowed}


def log_problems(text: str) -> list[str]:
    """Lines of a service's log that say ERROR, CRITICAL or start a traceback."""
    marks = (" ERROR ", " CRITICAL ", "ERROR:", "Traceback (most recent call last)")
    return [line for line in text.splitlines() if any(m in line for m in marks)]


# --- the verdict -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rules:
    warmup_s: float = 120.0
    warmup_fraction: float = 0.2  # of a run shorter than warmup_s / warmup_fraction
    window: int = 3  # samples in the baseline and in the end
    served_per_minute: float = 1.0
    rss_growth: float = 0.05
    tolerance: Mapping[str, float] = field(
        default_factory=lambda: {"fds": 8.0, "tasks": 16.0, "threads": 2.0}
    )

    def warmup(self, duration_s: float) -> float:
        return min(self.warmup_s, self.warmup_fraction * duration_s)

    def sample_times(self, duration_s: float, interval_s: float) -> list[float]:
        """When to sample: every `interval_s` from 0, and at the end; a run too short for
        both windows at that pace is sampled faster, so that the warm-up leaves at least
        `2 * window` samples after it (a short soak is a usable smoke test)."""
        after = duration_s - self.warmup(duration_s)
        interval_s = min(interval_s, after / (2 * self.window))
        times = [k * interval_s for k in range(int(duration_s / interval_s + 1e-9) + 1)]
        if duration_s - times[-1] > 1e-9:
            times.append(duration_s)
        return times


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


@dataclass(frozen=True)
class Windows:
    baseline: tuple[Sample, ...]
    end: tuple[Sample, ...]
    reference: tuple[Sample, ...]  # warm-up and baseline: the range load alone makes


def windows(samples: Sequence[Sample], duration_s: float, rules: Rules) -> Windows | None:
    """The baseline and end windows, or None when the run is too short for both."""
    after = [s for s in samples if s.t_s >= rules.warmup(duration_s)]
    if len(after) < 2 * rules.window:
        return None
    baseline = tuple(after[: rules.window])
    reference = tuple(s for s in samples if s.t_s <= baseline[-1].t_s)
    return Windows(baseline, tuple(after[-rules.window :]), reference)


def _span(samples: Sequence[Sample]) -> str:
    return f"{samples[0].t_s:.0f}-{samples[-1].t_s:.0f} s"


def _median(samples: Iterable[Sample], service: str, gauge: str) -> float:
    return statistics.median(s.of(service).gauge(gauge) for s in samples)


def verdict(
    samples: Sequence[Sample],
    duration_s: float,
    unexpected_errors: Mapping[str, int],
    served: int,
    rules: Rules | None = None,
) -> Verdict:
    """The goal's checks (see the module's docstring); `unexpected_errors`: description ->
    count, everything the run saw that is one; `served`: replies heard to the end."""
    rules = rules or Rules()
    total = sum(unexpected_errors.values())
    listed = ", ".join(f"{k}: {n}" for k, n in unexpected_errors.items() if n)
    needed = math.ceil(rules.served_per_minute * duration_s / 60)
    checks = [
        Check("no unexpected error", total == 0, listed or "none"),
        Check("the load ran", served >= needed, f"{served} replies served, at least {needed}"),
    ]
    w = windows(samples, duration_s, rules)
    if w is None:
        warmup = rules.warmup(duration_s)
        detail = f"{len(samples)} samples; need {2 * rules.window} after the {warmup:.0f} s warm-up"
        return Verdict((*checks, Check("enough samples", False, detail)))
    span = f"t {_span(w.baseline)} vs {_span(w.end)}"
    for service in SERVICES:
        base = _median(w.baseline, service, "rss_bytes")
        end = _median(w.end, service, "rss_bytes")
        growth = end / base - 1 if base > 0 else math.inf
        checks.append(
            Check(
                f"{service} RSS growth <= {rules.rss_growth:.0%}",
                growth <= rules.rss_growth,
                f"{base / MIB:.1f} -> {end / MIB:.1f} MiB ({growth:+.1%}; medians, {span})",
            )
        )
        for gauge, tolerance in rules.tolerance.items():
            limit = max(s.of(service).gauge(gauge) for s in w.reference) + tolerance
            last = _median(w.end, service, gauge)
            checks.append(
                Check(
                    f"{service} {gauge} flat",
                    last <= limit,
                    f"end median {last:.0f} <= {limit:.0f} (max to t {w.baseline[-1].t_s:.0f} s "
                    f"+ {tolerance:.0f})",
                )
            )
    return Verdict(tuple(checks))


# --- the table ---------------------------------------------------------------------------------


def rows_to_show(samples: Sequence[Sample], per_minute: bool) -> list[Sample]:
    """Every sample, or the last sample of each minute (and the very last) for long runs."""
    if not per_minute:
        return list(samples)
    shown: dict[int, Sample] = {}
    for s in samples:
        shown[int(s.t_s // 60)] = s
    rows = list(shown.values())
    if samples and rows[-1] is not samples[-1]:
        rows.append(samples[-1])
    return rows


def table(samples: Sequence[Sample], per_minute: bool = False) -> str:
    head = (
        f"{'t':>7} | {'gateway RSS MiB':>15} {'fds':>5} {'tasks':>5} {'thr':>4} | "
        f"{'model RSS MiB':>13} {'fds':>5} {'tasks':>5} {'thr':>4} | gateway errors (total by code)"
    )
    lines = [head, "-" * len(head)]
    for s in rows_to_show(samples, per_minute):
        g, m = s.gateway, s.model_server
        errors = ", ".join(f"{c} {n:.0f}" for c, n in sorted(g.errors.items()) if n) or "-"
        lines.append(
            f"{_clock(s.t_s):>7} | {g.rss_bytes / MIB:>15.1f} {g.fds:>5.0f} {g.tasks:>5.0f} "
            f"{g.threads:>4.0f} | {m.rss_bytes / MIB:>13.1f} {m.fds:>5.0f} {m.tasks:>5.0f} "
            f"{m.threads:>4.0f} | {errors}"
        )
    return "\n".join(lines)


def outcome_table(outcomes: Mapping[str, int]) -> str:
    width = max([len(k) for k in outcomes] + [7])
    lines = [f"  {name:<{width}}  {n:>6}" for name, n in sorted(outcomes.items())]
    lines.append(f"  {'total':<{width}}  {sum(outcomes.values()):>6}")
    return "\n".join(lines)


def verdict_lines(v: Verdict) -> str:
    lines = [f"  {'ok  ' if c.ok else 'FAIL'}  {c.name}: {c.detail}" for c in v.checks]
    lines.append(f"verdict: {'PASS' if v.ok else 'FAIL'}")
    return "\n".join(lines)


def _clock(t_s: float) -> str:
    minutes, seconds = divmod(round(t_s), 60)
    return f"{minutes}:{seconds:02d}"
