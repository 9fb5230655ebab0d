"""A model server's capacity counted in batches (pure; the server and a gateway's admission both
read it).

With `--batch on` the decoder steps of several replies run as one engine call: a batch of `n`
rows takes what the server learned for that size (its batch curve, `GET /load`'s
`batch_curve`: seconds per frame of each row's block, by batch size), which on a GPU is far
less than `n` steps alone. So what one reply costs the engine per second of its speech depends
on how many share its batches: its front pass and the rest of its work as alone, its decoder
steps as its share of a batch of them all (`batched_s`). How many replies the engine voices
at once (`realtime_streams`) is the largest number whose work fits its workers, and whose
batches the one decoder thread runs in real time; without a curve (`--batch off`, an older
server) it is the workers over what a reply costs alone, as before.

A batch size the curve has not seen is read as the model server's batcher reads it: from the
nearest size seen below, its rows costing as much as that size's (no more gain assumed); below
the smallest size seen, nothing is known (no gain either).
"""

from __future__ import annotations

from collections.abc import Mapping

from kokoro_contract.load import FRAME_S

Curve = Mapping[int, float]  # seconds per frame of a batched step, by batch size (rows)


def curve_of(report: Mapping[str, float] | None) -> dict[int, float] | None:
    """`GET /load`'s `batch_curve` (sizes as strings) by size; None when there is none."""
    if not report:
        return None
    return {int(size): seconds for size, seconds in report.items()}


def batch_seconds(curve: Curve, size: int, frames: int) -> float | None:
    """How long a batch of `size` rows of `frames` frames each takes, as learned (module
    docstring: a size not seen from the nearest seen below, no gain); None below the smallest
    seen."""
    if size in curve:
        return curve[size] * frames
    below = [n for n in curve if n < size]
    if not below:
        return None
    n = max(below)
    return curve[n] * frames * size / n


def row_share(curve: Curve | None, rows: int) -> float:
    """A row's share of a batch of `rows`, against the same step alone: 1.0 where batching
    gains nothing (or nothing is known: no curve, no size 1 seen), 0.25 where four rows take as
    long as one."""
    if not curve or rows <= 1:
        return 1.0
    alone = batch_seconds(curve, 1, 1)
    together = batch_seconds(curve, rows, 1)
    if alone is None or together is None or alone <= 0:
        return 1.0
    return together / rows / alone


def decoder_speech_s(curve: Curve | None) -> float:
    """The decoder steps' compute per second of speech of a reply stepped alone (0.0 unknown)."""
    alone = None if not curve else batch_seconds(curve, 1, 1)
    return 0.0 if alone is None else alone / FRAME_S


def batched_s(alone_s: float, speech_s: float, curve: Curve | None, replies: int) -> float:
    """The compute of work that gives `speech_s` seconds of speech and took `alone_s` alone
    (learned), when `replies` share the decoder's batches: its decoder steps at their share of
    a batch of them all, the rest as alone. `alone_s` where batching gains nothing (or loses:
    what a server learned already holds what its batches cost when they formed)."""
    gain = max(0.0, 1.0 - row_share(curve, replies))
    saved = speech_s * decoder_speech_s(curve) * gain
    return max(0.0, alone_s - saved)


def realtime_streams(workers: int, alone_s: float, curve: Curve | None) -> float:
    """How many replies the engine voices at once, each `alone_s` seconds of compute per second
    of speech alone: `workers / alone_s` unbatched; with a batch curve the most replies `n`
    whose work fits the workers at its batched cost (`batched_s`) and whose decoder steps,
    `n` rows a batch, the one decoder thread runs in real time. Fractional: it stops where the
    work of one more would not fit. Never below the unbatched count (what the server learned
    alone already holds whatever its batches cost)."""
    if alone_s <= 0:
        return float(workers)
    best = workers / alone_s
    decoder = decoder_speech_s(curve)
    if not curve or decoder <= 0:
        return best
    # past the largest size seen a batch's rows cost what that size's do: one more evaluation
    # there, its rows unbounded, covers every size above it
    largest = max(curve)
    for rows in range(2, largest + 2):
        cost = batched_s(alone_s, 1.0, curve, rows)
        fits = workers / cost if cost > 0 else float("inf")
        one_thread = 1.0 / (decoder * row_share(curve, rows))  # replies its batches keep up with
        limit = min(fits, one_thread)
        best = max(best, limit if rows > largest else min(float(rows), limit))
    return best
