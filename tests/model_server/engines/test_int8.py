"""The streamed decoder's int8 convolutions (`model_server.engines.int8`) on literal tensors:
close to the float convolution they replace (per output channel weights, the input's range
as the registry graph's `DynamicQuantizeLinear` takes it), the same answer to the same input,
the bias alone for silence, weight norm honoured, one packed kernel per convolution."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="the torch extra is part of `make setup`")

from model_server.engines import int8  # noqa: E402

pytestmark = pytest.mark.skipif(not int8.available(), reason="this torch has no oneDNN")


def _snr_db(reference: Any, other: Any) -> float:
    error = (other - reference).double().pow(2).sum().item()
    return 10 * math.log10(reference.double().pow(2).sum().item() / max(error, 1e-300))


def _conv(channels: int, kernel: int, dilation: int, stride: int = 1) -> Any:
    torch.manual_seed(7)
    return torch.nn.Conv1d(channels, channels, kernel, stride=stride, dilation=dilation).eval()


@pytest.mark.parametrize(
    ("channels", "kernel", "dilation", "stride"), [(16, 3, 1, 1), (32, 7, 3, 1), (8, 11, 5, 2)]
)
def test_the_int8_convolution_is_close_to_the_float_one(
    channels: int, kernel: int, dilation: int, stride: int
) -> None:
    conv = _conv(channels, kernel, dilation, stride)
    generator = torch.Generator().manual_seed(1)
    # a skewed input (a Snake's output is not centred): the zero point is not 128
    x = torch.randn(1, channels, 300, generator=generator).abs() * 2 - 0.3
    want = torch.nn.functional.conv1d(x, conv.weight, conv.bias, stride, 0, dilation)
    got = int8.Int8Conv(conv)(x)
    assert got.shape == want.shape
    assert got.dtype == torch.float32
    # 8 bits of input and weight: measured 36-40 dB on these
    assert _snr_db(want, got) >= 30
    assert torch.equal(got, int8.Int8Conv(conv)(x.clone()))  # the same input, the same bytes


def test_silence_gives_the_bias_alone() -> None:
    conv = _conv(16, 3, 1)
    got = int8.Int8Conv(conv)(torch.zeros(1, 16, 20))
    assert got.shape == (1, 16, 18)
    torch.testing.assert_close(got, conv.bias.detach().view(1, -1, 1).expand(1, 16, 18))


def test_a_weight_normed_convolution_computes_with_its_effective_weight() -> None:
    conv = _conv(16, 3, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        normed = torch.nn.utils.weight_norm(_conv(16, 3, 1))
    with torch.no_grad():
        normed.weight_g.mul_(3)  # the effective weight is 3x the direction's
    x = torch.randn(1, 16, 50, generator=torch.Generator().manual_seed(2))
    want = normed(x).detach()
    got = int8.Int8Conv(normed)(x)
    assert _snr_db(want, got) >= 30
    assert _snr_db(conv(x).detach(), got) < 10  # not the weight before the norm


def test_each_convolution_is_quantised_and_packed_once() -> None:
    convs = int8.Int8Convs()
    a, b = _conv(16, 3, 1), _conv(16, 3, 1)
    assert convs.kernel(a) is convs.kernel(a)
    assert convs.kernel(a) is not convs.kernel(b)
