"""The onnx decoder graph rewritten so that its instance norms take carried statistics
(progressive synthesis's windows, `carried_norms`: why, and the sums carried).

`carry_statistics` rewrites a decoder graph (in place): each norm's mean becomes
`m = (S + n * mean_w) / (N + n)` and its variance `(n * E_w[(x - m)^2] + Q - 2 m S + N m^2) /
(N + n)`, where `mean_w` and `E_w` are over the window (the graph's own nodes, so with nothing
carried the graph computes what it did), `n` the window's length at that norm's rate, and `S`,
`Q`, `N` the sums of the activations, of their squares, and their count carried in; it also
answers the sums over the window's core, for the next window. `NormStats` holds those sums.

The inputs and outputs it adds are named here (`sum_input`, ..., `FRAMES`); the engine feeds
them (`onnx`), `carried_norms.NormStats` reads and writes them. `topological` also orders the
nodes `registry_decoder` reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

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
