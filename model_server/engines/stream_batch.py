"""Streams of several sessions pushed as one batch, each keeping its own state.

A streamed layer (`streaming`) holds its state in the attributes its class names (`STATE`: the
caches, delay lines, what it has given) and is made of the streams its class names (`PARTS`).
Streams built alike (the same layers, the same weights) whose states have the same shapes (the
same history of input lengths: `signature`) can be pushed together: each state tensor of every
stream is stacked along the batch axis into the first stream, the push runs once over the
stacked input, and each stream gets back its own rows of the new state (`together`). Nothing
is mixed between the rows by the layers (a convolution, a norm with the row's own statistics,
an overlap-add all act row by row), so each stream's output is what it would have been alone,
up to the order of floating point sums inside a batched kernel. A layer that quantises its input
must do so row by row (`int8.Int8Conv`).

What is not a tensor in a state (a count of steps given, whether a padding has started) is the
same in streams of one signature and evolves with the shapes alone, so every stream gets the
first stream's new value.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor


def _parts(obj: Any) -> list[Any]:
    """The streams `obj` is made of, in a fixed order (lists and tuples of them flattened; a
    part not made yet is None)."""
    out: list[Any] = []

    def add(value: Any) -> None:
        if isinstance(value, list | tuple):
            for v in value:
                add(v)
        else:
            out.append(value)

    for name in getattr(type(obj), "PARTS", ()):
        add(getattr(obj, name))
    return out


def state(obj: Any) -> Any:
    """Everything a push may change in `obj` and its parts, nested: (own state, parts' states)."""
    if obj is None:
        return None
    own = tuple(getattr(obj, name) for name in getattr(type(obj), "STATE", ()))
    return own, tuple(state(p) for p in _parts(obj))


def _replica(obj: Any) -> Any:
    """A copy of a stream and of every stream it is made of (their state is loaded after: only
    the structure and what is shared, the weights, matter)."""
    if isinstance(obj, list | tuple):
        items = [_replica(v) for v in obj]
        return items if isinstance(obj, list) else tuple(items)
    if obj is None or not (hasattr(type(obj), "STATE") or hasattr(type(obj), "PARTS")):
        return obj
    made = copy.copy(obj)
    for name in getattr(type(obj), "PARTS", ()):
        setattr(made, name, _replica(getattr(obj, name)))
    return made


def load(obj: Any, value: Any, like: Any = None) -> None:
    """`state(obj)`'s inverse: `value` put back into `obj` and its parts. A part that a stream
    makes at its first push (`ISTFT`'s) and `obj` has not made yet is copied from `like`'s (a
    stream built alike that has)."""
    if obj is None:
        return
    own, parts = value
    for name, v in zip(getattr(type(obj), "STATE", ()), own, strict=True):
        setattr(obj, name, v)
    if like is not None:
        for name in getattr(type(obj), "PARTS", ()):
            if getattr(obj, name) is None and getattr(like, name) is not None:
                setattr(obj, name, _replica(getattr(like, name)))
    liked = _parts(like) if like is not None else [None] * len(parts)
    for p, v, q in zip(_parts(obj), parts, liked, strict=True):
        load(p, v, q)


def _shape(value: Any) -> Any:
    if isinstance(value, Tensor):
        return ("tensor", tuple(value.shape[1:]), value.dtype, value.device)
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_shape(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _shape(v)) for k, v in value.items()))
    return value


def signature(obj: Any) -> Any:
    """What streams pushed together must share: the structure of their states, each tensor's
    shape but its batch rows, every other value itself. Hashable."""
    return _shape(state(obj))


class DifferentStates(ValueError):
    """Streams whose states differ in more than their rows: they cannot be pushed together."""


def _stacked(values: Sequence[Any]) -> Any:
    """The streams' values of one piece of state stacked by rows: tensors of the same shape
    but their rows concatenated, anything else equal in all (`DifferentStates` where not)."""
    first = values[0]
    if isinstance(first, Tensor):
        if any(
            not isinstance(v, Tensor)
            or v.shape[1:] != first.shape[1:]
            or v.dtype != first.dtype
            or v.device != first.device
            for v in values
        ):
            raise DifferentStates("streams of different states pushed together")
        return torch.cat(list(values), dim=0)
    if isinstance(first, list | tuple):
        if any(type(v) is not type(first) or len(v) != len(first) for v in values):
            raise DifferentStates("streams of different states pushed together")
        merged = [_stacked([v[i] for v in values]) for i in range(len(first))]
        return merged if isinstance(first, list) else tuple(merged)
    if isinstance(first, dict):
        if any(not isinstance(v, dict) or v.keys() != first.keys() for v in values):
            raise DifferentStates("streams of different states pushed together")
        return {k: _stacked([v[k] for v in values]) for k in first}
    if any(type(v) is not type(first) or v != first for v in values):
        raise DifferentStates("streams of different states pushed together")
    return first


def _rows(value: Any, sizes: Sequence[int]) -> list[Any]:
    """`value` (stacked) cut back into each stream's rows, `sizes` of them each."""
    if isinstance(value, Tensor):
        return list(torch.split(value, list(sizes), dim=0))
    if isinstance(value, list | tuple):
        columns = [_rows(v, sizes) for v in value]
        rows = [[c[i] for c in columns] for i in range(len(sizes))]
        return rows if isinstance(value, list) else [tuple(r) for r in rows]
    if isinstance(value, dict):
        cut = {k: _rows(v, sizes) for k, v in value.items()}
        return [{k: c[i] for k, c in cut.items()} for i in range(len(sizes))]
    return [value] * len(sizes)


def together(
    streams: Sequence[Any], inputs: Sequence[Sequence[Tensor]], push: Callable[..., Tensor]
) -> list[Tensor]:
    """`push(stream, *xs)` for each stream with its `inputs`, computed as one push of the first
    stream over every stream's state and inputs stacked: each stream's output (its rows of the
    batch's), each stream left with its own state after it. The streams are built alike and
    share a `signature` (`DifferentStates`, a `ValueError`, before anything is pushed where they
    do not: checked as the states are stacked). A push that fails leaves the streams' states
    unusable."""
    if len(streams) != len(inputs) or not streams:
        raise ValueError("one list of inputs per stream, at least one stream")
    if len(streams) == 1:
        return [push(streams[0], *inputs[0])]
    states = [state(s) for s in streams]
    stacked = _stacked(states)
    sizes = [int(xs[0].shape[0]) for xs in inputs]
    lead = streams[0]
    load(lead, stacked)
    columns = [torch.cat([xs[i] for xs in inputs], dim=0) for i in range(len(inputs[0]))]
    out = push(lead, *columns)
    for stream, rows in zip(streams, _rows(state(lead), sizes), strict=True):
        load(stream, rows, lead)
    return list(torch.split(out, sizes, dim=0))
