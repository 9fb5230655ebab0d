"""Streams of several sessions pushed as one batch (`model_server.engines.stream_batch`): on
literal tensors through a stack of convolutions, transposed convolutions, joins, paddings and an
STFT/iSTFT, each stream's output and state are what they would be alone, whatever it was
pushed before; streams whose states differ are refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from model_server.engines import stream_batch
from model_server.engines.streaming import (
    ISTFT,
    Pad,
    Parallel,
    Pointwise,
    Seq,
    conv1d,
    conv_transpose1d,
    identity,
    stft,
)

torch = pytest.importorskip("torch", reason="the torch extra is part of `make setup`")
F = torch.nn.functional


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _modules(rows: bool = False) -> dict[str, Any]:
    torch.manual_seed(3)
    return {
        "conv": torch.nn.Conv1d(4, 6, 3, padding=1, dtype=torch.float64),
        "dilated": torch.nn.Conv1d(6, 6, 3, padding=2, dilation=2, dtype=torch.float64),
        "up": torch.nn.ConvTranspose1d(6, 4, 4, stride=2, padding=1, dtype=torch.float64),
        "strided": torch.nn.Conv1d(4, 4, 4, stride=2, padding=1, dtype=torch.float64),
        "rows": rows,
    }


def _stack(m: dict[str, Any]) -> Seq:
    """Conv, a residual block of a dilated conv, an upsampling, a strided conv, a reflection."""
    rows = bool(m["rows"])
    return Seq(
        conv1d(m["conv"], rows=rows),
        Parallel([conv1d(m["dilated"], rows=rows), identity()], torch.add),
        Pointwise(torch.tanh),
        conv_transpose1d(m["up"], rows),
        conv1d(m["strided"], rows=rows),
        Pad(2, 1, "reflect"),
    )


def _pushed(stream: Seq, x: Any, sizes: list[int]) -> list[Any]:
    outs, start = [], 0
    for size in sizes:
        outs.append(stream.push(x[..., start : start + size]))
        start += size
    return outs


@pytest.mark.parametrize("rows", [False, True])
def test_streams_pushed_together_give_each_what_it_gives_alone(rows: bool) -> None:
    """Three streams with histories of the same lengths but other values: their next pushes as
    one batch, then each alone from a copy of the same state, give the same outputs and leave
    the same state (the next push and the flush agree too)."""
    m = _modules(rows)
    inputs = [torch.randn(1, 4, 40, dtype=torch.float64) * (i + 1) for i in range(3)]
    history = [5, 7, 0, 3]
    alone = [_stack(m) for _ in inputs]
    batched = [_stack(m) for _ in inputs]
    for streams in (alone, batched):
        for stream, x in zip(streams, inputs, strict=True):
            _pushed(stream, x, history)
    seen = sum(history)
    for size in (6, 9):
        expected = [s.push(x[..., seen : seen + size]) for s, x in zip(alone, inputs, strict=True)]
        got = stream_batch.together(
            batched,
            [(x[..., seen : seen + size],) for x in inputs],
            lambda s, x: s.push(x),
        )
        for e, g in zip(expected, got, strict=True):
            assert g.shape == e.shape
            torch.testing.assert_close(g, e, rtol=0, atol=1e-12)
        seen += size
    for a, b in zip(alone, batched, strict=True):  # the state each was left with is its own
        torch.testing.assert_close(b.flush(), a.flush(), rtol=0, atol=1e-12)


def test_streams_with_different_histories_are_refused_and_left_as_they_were() -> None:
    m = _modules()
    x = torch.randn(1, 4, 30, dtype=torch.float64)
    one, other = _stack(m), _stack(m)
    _pushed(one, x, [5])
    _pushed(other, x, [6])  # one more step in its caches
    assert stream_batch.signature(one) != stream_batch.signature(other)
    before = stream_batch.signature(one)
    with pytest.raises(stream_batch.DifferentStates, match="different states"):
        stream_batch.together([one, other], [(x[..., :4],), (x[..., :4],)], lambda s, x: s.push(x))
    assert stream_batch.signature(one) == before


def test_a_part_made_at_the_first_push_is_made_for_every_stream() -> None:
    """The iSTFT makes its overlap-adds at its first push: pushed together first, each stream
    gets its own (not the lead's), and later pushes alone agree with streams never batched."""
    n_fft, hop = 16, 4
    window = torch.hann_window(n_fft, dtype=torch.float64)

    def make() -> Seq:
        return Seq(stft(n_fft, hop, window), ISTFT(n_fft, hop, window))

    signals = [torch.randn(1, 1, 200, dtype=torch.float64) * (i + 1) for i in range(2)]
    alone = [make() for _ in signals]
    batched = [make() for _ in signals]
    expected = [s.push(x[..., :80]) for s, x in zip(alone, signals, strict=True)]
    got = stream_batch.together(batched, [(x[..., :80],) for x in signals], lambda s, x: s.push(x))
    istfts: list[Any] = [s.layers[1] for s in batched]
    assert istfts[0]._signal is not istfts[1]._signal
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=0, atol=1e-12)
    for a, b, x in zip(alone, batched, signals, strict=True):  # then alone: still their own
        torch.testing.assert_close(b.push(x[..., 80:]), a.push(x[..., 80:]), rtol=0, atol=1e-12)
        torch.testing.assert_close(b.flush(), a.flush(), rtol=0, atol=1e-12)


def test_float_convolutions_row_by_row_give_each_row_its_bytes_alone() -> None:
    """oneDNN may choose a float32 convolution's algorithm by the batch (it does for Kokoro's
    first upsampling, 512 to 256 channels, stride 10): computed row by row, a row batched gets
    exactly the bytes it gets alone, which a quantised layer after it needs."""
    torch.manual_seed(0)
    up = torch.nn.ConvTranspose1d(512, 256, 20, stride=10, padding=5)
    noise = torch.nn.Conv1d(22, 256, 12, stride=6, padding=3)
    x, source = torch.randn(3, 512, 32), torch.randn(3, 22, 333)
    for make, batch in (
        (lambda: conv_transpose1d(up, rows=True), x),
        (lambda: conv1d(noise, rows=True), source),
    ):
        together = make().push(batch)
        alone = torch.cat([make().push(row) for row in batch.split(1)])
        assert torch.equal(together, alone)
