"""Cached-state streaming layers (`model_server.engines.streaming`): pushed in windows of any
size and flushed, each layer and each stack of them gives the whole call's output; outputs come
as soon as the inputs they read are in (the delay is the stack's right lookahead); the state
kept is what the layers read again."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from model_server.engines.streaming import (
    ISTFT,
    Join,
    Pad,
    Parallel,
    Pointwise,
    Seq,
    Stream,
    conv1d,
    conv_transpose1d,
    identity,
    run_in_windows,
    stft,
)

torch = pytest.importorskip("torch", reason="the torch extra is part of `make setup`")


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: the tensors are small, and two threads spin against whatever else
    the machine runs (a loaded 2-core machine made these tests 10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


F = torch.nn.functional

# windows of 1..N steps, a ragged schedule with empty pushes, and one window of everything
SCHEDULES: list[Sequence[int]] = [[1], [2], [3], [5], [8], [1, 0, 4, 2, 7, 0, 3], [10_000]]


def _check(
    make: Callable[[], Stream],
    whole: Callable[[Any], Any],
    x: Any,
    schedules: Sequence[Sequence[int]] = SCHEDULES,
) -> None:
    expected = whole(x)
    for sizes in schedules:
        got = run_in_windows(make(), x, sizes)
        assert got.shape == expected.shape, sizes
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12, msg=str(sizes))


def _conv(cin: int, cout: int, k: int, **kw: int) -> Any:
    torch.manual_seed(cin * 100 + cout * 10 + k + sum(kw.values()))
    return torch.nn.Conv1d(cin, cout, k, **kw).double()


def _x(channels: int, steps: int, seed: int = 0) -> Any:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(2, channels, steps, dtype=torch.float64, generator=generator)


def test_a_literal_convolution_streamed_one_step_at_a_time() -> None:
    conv = torch.nn.Conv1d(1, 1, 3, padding=1, bias=False).double()
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[[1.0, 2.0, 3.0]]]))
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]], dtype=torch.float64)
    stream = conv1d(conv)
    outs = [stream.push(x[..., t : t + 1]).flatten().tolist() for t in range(4)]
    # y[t] = 1 x[t-1] + 2 x[t] + 3 x[t+1], zeros beyond the ends: each output one step late
    assert outs == [[], [8.0], [14.0], [20.0]]
    assert stream.flush().flatten().tolist() == [11.0]
    assert conv(x).flatten().tolist() == [8.0, 14.0, 20.0, 11.0]


@pytest.mark.parametrize(
    ("k", "kw"),
    [
        (3, {"padding": 1}),
        (1, {}),
        (7, {"padding": 3}),
        (3, {"padding": 5, "dilation": 5}),  # an AdaINResBlock1's third convolution
        (11, {"padding": 15, "dilation": 3}),
        (12, {"padding": 3, "stride": 6}),  # the generator's first noise convolution
        (3, {"padding": 1, "stride": 2}),  # F0_conv, N_conv
        (4, {"padding": 0, "stride": 3}),
        (3, {"padding": 2, "dilation": 2, "stride": 2, "groups": 2}),
    ],
)
def test_a_convolution_streamed_is_the_whole_call(k: int, kw: dict[str, int]) -> None:
    conv = _conv(4, 6, k, **kw)
    _check(lambda: conv1d(conv), conv, _x(4, 37))


def test_a_convolution_keeps_kernel_minus_one_times_dilation_inputs() -> None:
    conv = _conv(4, 6, 3, padding=5, dilation=5)
    stream = conv1d(conv)
    for t in range(20):
        stream.push(_x(4, 1, t))
    assert stream.state_bytes() == (3 - 1) * 5 * 2 * 4 * 8  # steps x batch x channels x 8 bytes


@pytest.mark.parametrize(
    ("k", "stride", "padding", "output_padding", "groups"),
    [
        (20, 10, 5, 0, 1),  # ups.0
        (12, 6, 3, 0, 1),  # ups.1
        (3, 2, 1, 1, 4),  # the depthwise pool of decode.3
        (4, 2, 3, 0, 1),  # a right crop longer than the overlap: held back
        (3, 2, 0, 1, 1),  # output padding beyond the crop: the bias appended
        (5, 5, 0, 0, 2),  # no overlap
        (6, 2, 0, 0, 1),
    ],
)
def test_a_transposed_convolution_streamed_is_the_whole_call(
    k: int, stride: int, padding: int, output_padding: int, groups: int
) -> None:
    torch.manual_seed(k + stride)
    conv = torch.nn.ConvTranspose1d(
        4, 4 if groups > 1 else 3, k, stride, padding, output_padding, groups
    ).double()
    _check(lambda: conv_transpose1d(conv), conv, _x(4, 13))


def test_a_transposed_convolution_emits_each_step_s_outputs_when_it_arrives() -> None:
    torch.manual_seed(1)
    conv = torch.nn.ConvTranspose1d(2, 2, 20, 10, 5).double()
    stream = conv_transpose1d(conv)
    lengths = [stream.push(_x(2, 1, t)).shape[-1] for t in range(4)]
    assert lengths == [5, 10, 10, 10]  # the first 5 are cropped: no delay at all
    assert stream.state_bytes() == 10 * 2 * 2 * 8  # the overlapping tail: kernel - stride


@pytest.mark.parametrize(("left", "right"), [(1, 0), (0, 2), (3, 3), (10, 10)])
def test_reflection_padding_streamed(left: int, right: int) -> None:
    _check(
        lambda: Pad(left, right, "reflect"), lambda x: F.pad(x, (left, right), "reflect"), _x(3, 23)
    )


def test_zero_padding_and_the_empty_input() -> None:
    _check(lambda: Pad(2, 3), lambda x: F.pad(x, (2, 3)), _x(3, 9))
    pad = Pad(2, 3)
    assert pad.push(_x(3, 0)).shape[-1] == 2
    assert pad.flush().shape[-1] == 3


def test_a_reflection_longer_than_the_input_fails_like_the_whole_call() -> None:
    pad = Pad(3, 0, "reflect")
    pad.push(_x(1, 3))
    with pytest.raises(ValueError, match="reflection of 3"):
        pad.flush()


def test_an_stft_streamed_is_torch_s() -> None:
    window = torch.hann_window(20, periodic=True, dtype=torch.float64)
    x = _x(1, 203)

    def whole(x: Any) -> Any:
        return torch.stft(x[:, 0], 20, 5, 20, window=window, return_complex=True)

    _check(lambda: stft(20, 5, window), whole, x)


def test_an_istft_streamed_is_torch_s() -> None:
    window = torch.hann_window(20, periodic=True, dtype=torch.float64)
    generator = torch.Generator().manual_seed(3)
    spec = torch.randn(2, 11, 41, dtype=torch.complex128, generator=generator)

    def whole(spec: Any) -> Any:
        return torch.istft(spec, 20, 5, 20, window=window).unsqueeze(-2)

    _check(lambda: ISTFT(20, 5, window), whole, spec)


def test_an_stft_then_its_inverse_streamed_gives_the_samples_back_delayed_by_the_lookahead() -> (
    None
):
    window = torch.hann_window(20, periodic=True, dtype=torch.float64)
    x = _x(1, 200)
    stream = Seq(stft(20, 5, window), ISTFT(20, 5, window))
    outs = [stream.push(x[..., t : t + 5]) for t in range(0, 200, 5)]
    torch.testing.assert_close(torch.cat([*outs, stream.flush()], -1), x, rtol=1e-12, atol=1e-12)
    emitted = list(itertools.accumulate(o.shape[-1] for o in outs))
    # a sample is final once the frames over it are in: 15 samples behind, after the start
    assert [5 * (k + 1) - e for k, e in enumerate(emitted)][3:] == [15] * (len(outs) - 3)


def _snake(alpha: Any) -> Callable[[Any], Any]:
    return lambda x: x + (1 / alpha) * torch.sin(alpha * x) ** 2


def test_a_stack_with_residual_branches_of_different_latencies_streamed_is_the_whole_call() -> None:
    """Strided and dilated convolutions, a transposed one, a residual block whose branch
    lags its shortcut by 6 steps, a concatenation of inputs at different delays, an
    overlap-add at the end: the whole call's output, in windows of any size."""
    down = _conv(3, 8, 4, stride=2, padding=1)
    a = _conv(8, 8, 3, padding=1)
    b = _conv(8, 8, 3, padding=5, dilation=5)
    skip = _conv(3, 4, 3, stride=2, padding=1)
    torch.manual_seed(5)
    up = torch.nn.ConvTranspose1d(12, 11, 12, 6, 3).double()
    alpha = torch.rand(1, 8, 1, dtype=torch.float64) + 0.5
    window = torch.hann_window(10, dtype=torch.float64)

    def to_spec(frames: Any) -> Any:
        """11 channels as 6 bins: real parts, then imaginary ones (the last bin's zero)."""
        return torch.complex(frames[:, :6], F.pad(frames[:, 6:11], (0, 0, 0, 1)))

    def whole_stack(x: Any) -> Any:
        h = down(x)
        h = b(_snake(alpha)(a(F.leaky_relu(h, 0.1)))) + h
        h = torch.cat([h, skip(x)], 1)
        return torch.istft(to_spec(up(h)), 10, 5, 10, window=window).unsqueeze(-2)

    def make_stack() -> Stream:
        residual = Parallel(
            [
                Seq(
                    Pointwise(lambda h: F.leaky_relu(h, 0.1)),
                    conv1d(a),
                    Pointwise(_snake(alpha)),
                    conv1d(b),
                ),
                identity(),
            ],
            torch.add,
        )
        body = Parallel(
            [Seq(conv1d(down), residual), conv1d(skip)], lambda h, s: torch.cat([h, s], 1)
        )
        return Seq(
            body,
            conv_transpose1d(up),
            Pointwise(to_spec),
            ISTFT(10, 5, window),
        )

    _check(make_stack, whole_stack, _x(3, 40))


def test_a_join_waits_for_the_input_behind_and_refuses_unequal_ends() -> None:
    join = Join(torch.add, 2)
    ones = torch.ones(1, 1, 3)
    assert join.push(ones, ones[..., :1]).flatten().tolist() == [2.0]
    assert join.state_bytes() == 2 * 4  # the two steps the first input is ahead
    assert join.push(ones[..., :0], 2 * ones).flatten().tolist() == [3.0, 3.0]
    join.push(ones[..., :0], ones)
    with pytest.raises(RuntimeError, match="different lengths"):
        join.flush()


def test_cancelling_a_stream_is_dropping_it() -> None:
    conv = _conv(2, 2, 3, padding=1)
    x = _x(2, 10)
    first = conv1d(conv)
    first.push(x[..., :4])
    del first  # cancelled between windows: nothing else holds its state
    torch.testing.assert_close(run_in_windows(conv1d(conv), x, [4]), conv(x))
