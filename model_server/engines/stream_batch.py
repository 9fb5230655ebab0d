"""Streams of several sessions pushed as one batch, each keeping its own state.

A streamed layer (`streaming`) holds its state in the attributes its class names (`STATE`: the
caches, delay lines, what it has given) and is made of the streams its class names (`PARTS`).
Streams built alike (the same layers, the same weights) whose states have the same shapes (the
same history of input lengths: `signature`) can be pushed together: each state tensor of every
stream is stacked along the batch axis into the first stream, the push runs once over the
stacked input, and each stream gets back its own rows of the new state (`together`). Nothing
is mixed between the rows by the layers (a convolution, a norm with the row's own statistics,
an overlap-add all act row by row), so each stream's output is what it would have been alone,
up to the order of floating point sums inside a batched kernel; where that order would matter
(a float convolution before quantised ones) the layer computes row by row
(`streaming.row_by_row`), and a layer that quantises its input does so row by row
(`int8.Int8Conv`): the streamed decoder's rows are then bit for bit its streams alone.

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


_SLOTS = "_batch_slots"  # a stream's `_slots`, kept on it once none of its parts is missing


def _walk(obj: Any, out: list[tuple[Any, str]]) -> bool:
    """`obj`'s state into `out`; False where a part is not made yet."""
    if obj is None:
        return False
    out.extend((obj, name) for name in getattr(type(obj), "STATE", ()))
    complete = True
    for part in _parts(obj):
        complete = _walk(part, out) and complete
    return complete


def _slots(root: Any) -> tuple[list[tuple[Any, str]], bool]:
    """Every piece of state of a stream and its parts, flat: (holder, attribute), in a fixed
    order (a part not made yet has none), and whether every part is made. Walked once: kept
    on the stream when complete (its layers do not change after)."""
    kept = root.__dict__.get(_SLOTS)
    if kept is not None:
        return kept, True
    out: list[tuple[Any, str]] = []
    complete = _walk(root, out)
    if complete:
        root.__dict__[_SLOTS] = out
    return out, complete


def _complete(obj: Any, like: Any) -> None:
    """The parts `like` has made (at its first push) that `obj`, built alike, has not yet:
    copied (their state is loaded after)."""
    if obj is None or like is None:
        return
    for name in getattr(type(obj), "PARTS", ()):
        if getattr(obj, name) is None and getattr(like, name) is not None:
            setattr(obj, name, _replica(getattr(like, name)))
    for part, liked in zip(_parts(obj), _parts(like), strict=True):
        _complete(part, liked)


def together(
    streams: Sequence[Any], inputs: Sequence[Sequence[Tensor]], push: Callable[..., Tensor]
) -> list[Tensor]:
    """`push(stream, *xs)` for each stream with its `inputs`, computed as one push of the first
    stream over every stream's state and inputs stacked: each stream's output (its rows of the
    batch's), each stream left with its own state after it. The streams are built alike and
    share a `signature` (`DifferentStates`, a `ValueError`, before anything is pushed where they
    do not: checked as the states are stacked). A push that fails leaves the streams' states
    unusable. The state is handled flat (`_slots`): a stack of a few hundred layers costs a few
    milliseconds a batch, not a walk of its tree per value."""
    if len(streams) != len(inputs) or not streams:
        raise ValueError("one list of inputs per stream, at least one stream")
    if len(streams) == 1:
        return [push(streams[0], *inputs[0])]
    walked = [_slots(s) for s in streams]
    slots = [own for own, _ in walked]
    if any(len(other) != len(slots[0]) for other in slots):
        raise DifferentStates("streams of different states pushed together")
    values = [[getattr(holder, name) for holder, name in own] for own in slots]
    stacked = [_stacked([v[i] for v in values]) for i in range(len(slots[0]))]
    sizes = [int(xs[0].shape[0]) for xs in inputs]
    lead = streams[0]
    for (holder, name), value in zip(slots[0], stacked, strict=True):
        setattr(holder, name, value)
    columns = [torch.cat([xs[i] for xs in inputs], dim=0) for i in range(len(inputs[0]))]
    out = push(lead, *columns)
    if not all(complete for _, complete in walked):  # the lead made parts at this push
        for stream in streams[1:]:
            _complete(stream, lead)
        slots = [_slots(s)[0] for s in streams]
    for i, (holder, name) in enumerate(slots[0]):
        for own, row in zip(slots, _rows(getattr(holder, name), sizes), strict=True):
            setattr(own[i][0], own[i][1], row)
    return list(torch.split(out, sizes, dim=0))
