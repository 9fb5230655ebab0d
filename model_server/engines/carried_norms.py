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
the prior outweighed a short segment: "Hello there." ended 7.8 dB quieter than one call's and was
trimmed 77 ms shorter; docs/measured.md, the night of 2026-12-01).

`carry_statistics` rewrites a decoder graph (in place): each norm's mean becomes
`m = (S + n * mean_w) / (N + n)` and its variance `(n * E_w[(x - m)^2] + Q - 2 m S + N m^2) /
(N + n)`, where `mean_w` and `E_w` are over the window (the graph's own nodes, so with nothing
carried the graph computes what it did), `n` the window's length at that norm's rate, and `S`,
`Q`, `N` the sums of the activations, of their squares, and their count carried in; it also
answers the sums over the window's core, for the next window. `NormStats` holds those sums.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

PRIOR_FRAMES = 96.0  # how much the voice's reference statistics weigh, in frames
# Two sentences of reference speech (espeak-ng's phonemes; about 11 s at speed 1), not in the
# quality corpus; measured on the corpus with jm_kumo: word error rate 0.216 against one call's
# 0.209, 0.258 with nothing but the segment's own frames, 0.288 with each window's own.
CALIBRATION_PHONEMES = (
    "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ nˌɪɹ ðə ɹˈɪvəɹ bˈæŋk.",
    "wʊd ju lˈIk mˌi tə swˈɪʧ jʊɹ əkˈWnt tə ðɪ ˈænjuᵊl plˈæn tədˈA, ɔɹ kˈip ðə mˈʌnθli wˌʌn?",
)

PRIOR = "carried/prior_frames"  # frames carried in (N at frame rate), float [1]
FRAMES = "carried/frames"  # the frames the window decodes, float [1]
CORE_LEFT = "carried/core_left"  # where the window's core starts, in its frames, float [1]
CORE_FRAMES = "carried/core_frames"  # the core's frames, float [1]


def sum_input(k: int) -> str:
    return f"carried/{k}/sum"


def squares_input(k: int) -> str:
    return f"carried/{k}/squares"


def sum_output(k: int) -> str:
    return f"carried/{k}/core_sum"


def squares_output(k: int) -> str:
    return f"carried/{k}/core_squares"


def carry_statistics(model: Any) -> int:
    """Rewrite the onnx decoder graph `model` so that its instance norms take carried
    statistics (the module's docstring); a new input, `FRAMES`, counts the frames the window
    decodes (each norm's rate is its length over them). Returns how many norms it found;
    `ValueError` when the graph has none of the shape Kokoro's export gives (ReduceMean over
    time, Sub, the mean of the squares)."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    axes_of = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in dict.fromkeys(node.input):  # a node that reads a tensor twice, once
            consumers.setdefault(name, []).append(node)
    norms: list[tuple[Any, Any]] = []  # (the mean's ReduceMean, the variance's)
    for node in graph.node:
        if node.op_type != "ReduceMean" or len(node.input) < 2:
            continue
        if axes_of.get(node.input[1]) is None or list(axes_of[node.input[1]]) not in ([2], [-1]):
            continue
        subs = [c for c in consumers.get(node.output[0], []) if c.op_type == "Sub"]
        if len(subs) != 1 or subs[0].input[1] != node.output[0]:
            continue
        centred = subs[0].output[0]
        squares = [
            c
            for c in consumers.get(centred, [])
            if c.op_type == "Mul" and list(c.input) == [centred, centred]
        ]
        variances = [
            r
            for s in squares
            for r in consumers.get(s.output[0], [])
            if r.op_type == "ReduceMean" and r.input[1] == node.input[1]
        ]
        if len(variances) == 1:
            norms.append((node, variances[0]))
    if not norms:
        raise ValueError("no instance norm of the shape Kokoro's decoder has")

    def const(name: str, value: Any) -> None:
        graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))

    const("carried/time_axis", np.array([2], np.int64))
    const("carried/two", np.array(2, np.int64))
    nodes: list[Any] = []

    def add(op: str, inputs: list[str], output: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    def length(tensor: str, name: str) -> str:
        shape = add("Shape", [tensor], f"{name}/shape")
        return add("Cast", [add("Gather", [shape, "carried/two"], f"{name}/n64")], name, to=1)

    frames = FRAMES
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, [1])
        for n in (PRIOR, CORE_LEFT, CORE_FRAMES, FRAMES)
    ]
    outputs = []
    renamed: dict[str, str] = {}
    axis = "carried/time_axis"
    for k, (mean_node, var_node) in enumerate(norms):
        p = f"carried/{k}/"
        x = mean_node.input[0]
        inputs.append(helper.make_tensor_value_info(sum_input(k), TensorProto.FLOAT, [1, None, 1]))
        inputs.append(
            helper.make_tensor_value_info(squares_input(k), TensorProto.FLOAT, [1, None, 1])
        )
        # the window's own statistics stay the graph's nodes, renamed; the carried ones take
        # their old names, so every consumer reads the carried statistics
        own_mean, own_var = p + "window_mean", p + "window_var"
        renamed[mean_node.output[0]] = own_mean
        renamed[var_node.output[0]] = own_var
        n = length(x, p + "n")
        rate = add("Div", [n, frames], p + "rate")
        carried_n = add("Mul", [PRIOR, rate], p + "N")
        total = add("Add", [carried_n, n], p + "total")
        window_sum = add("Mul", [n, own_mean], p + "window_sum")
        mean = add(
            "Div", [add("Add", [sum_input(k), window_sum], p + "all_sum"), total], p + "mean"
        )
        # Q - 2 m S + N m^2: the carried frames' squares about the carried mean
        m_s = add("Mul", [mean, sum_input(k)], p + "mS")
        m2 = add("Mul", [mean, mean], p + "m2")
        carried_sq = add(
            "Add",
            [
                add("Sub", [squares_input(k), add("Add", [m_s, m_s], p + "2mS")], p + "Q-2mS"),
                add("Mul", [carried_n, m2], p + "Nm2"),
            ],
            p + "carried_sq",
        )
        # the window's squares about the carried mean: the graph's own variance node now reads
        # the centring Sub, which subtracts the carried mean (it consumes the mean's old name)
        window_sq = add("Mul", [n, own_var], p + "window_sq")
        variance = add("Add", [window_sq, carried_sq], p + "all_sq")
        nodes.append(
            helper.make_node("Div", [variance, total], [p + "var_raw"], name=p + "var_raw")
        )
        nodes.append(helper.make_node("Relu", [p + "var_raw"], [var_node.output[0]]))
        nodes.append(helper.make_node("Identity", [mean], [mean_node.output[0]]))
        # the core's sums, for the next window
        start = add("Mul", [CORE_LEFT, rate], p + "core_start_f")
        end = add(
            "Mul",
            [add("Add", [CORE_LEFT, CORE_FRAMES], p + "core_end_frames"), rate],
            p + "core_end_f",
        )
        start_i = add("Cast", [add("Round", [start], p + "core_start_r")], p + "core_start", to=7)
        end_i = add("Cast", [add("Round", [end], p + "core_end_r")], p + "core_end", to=7)
        core = add("Slice", [x, start_i, end_i, axis], p + "core")
        add("ReduceSum", [core, axis], sum_output(k), keepdims=1)
        core_sq = add("Mul", [core, core], p + "core_sq")
        add("ReduceSum", [core_sq, axis], squares_output(k), keepdims=1)
        for name in (sum_output(k), squares_output(k)):
            outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, None, 1]))
    for old in graph.node:
        for i, name in enumerate(old.output):
            if name in renamed:
                old.output[i] = renamed[name]
    graph.node.extend(nodes)
    graph.input.extend(inputs)
    graph.output.extend(outputs)
    _sort_topologically(graph)
    return len(norms)


def topological(nodes: list[Any], known: set[str], what: str) -> list[Any]:
    """The onnx `nodes` in an order that computes each input before it is read, given the
    tensor names already `known` (graph inputs, initializers); `ValueError` naming `what` at
    a cycle."""
    known = known | {""}  # an omitted optional input
    ordered: list[Any] = []
    pending = list(nodes)
    while pending:
        ready = [n for n in pending if all(i in known for i in n.input)]
        if not ready:
            raise ValueError(f"{what} has a cycle at {pending[0].name}")
        for n in ready:
            known.update(n.output)
        ordered += ready
        ready_ids = {id(n) for n in ready}
        pending = [n for n in pending if id(n) not in ready_ids]
    return ordered


def _sort_topologically(graph: Any) -> None:
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    ordered = topological(list(graph.node), known, "the rewritten graph")
    del graph.node[:]
    graph.node.extend(ordered)


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


def prior_weight(prior_frames: float, after: int) -> float:
    """How much the prior weighs for a window with `after` frames of its segment still to come
    after it: as many as they are, at most `prior_frames` (none for the last window)."""
    return max(0.0, min(prior_frames, float(after)))


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
