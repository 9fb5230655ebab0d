"""The streamed decoder's convolutions in int8 on the CPU (oneDNN's quantized convolution).

Kokoro's decoder spends most of its time in its convolutions (the generator's resblocks at 128
and 256 channels, kernels 3, 7 and 11). In float32 on the CPU they are slower than the registry
graph's own int8 `ConvInteger`s, so a decoder streamed in float is slower than the graph's one
call; the same convolutions in int8 through oneDNN (VNNI where the CPU has it) take well under
float's time, the quantisation of their input included (docs/measured.md, "2026-12-06 (night):
the stream in int8, the generator alone, a prior by length, the default").

The weights are quantised once, per output channel, symmetric (`[-127, 127]`), from the float
weights the decoder computes with (the registry graph's own, dequantised: `registry_decoder`).
An input is quantised as the registry graph quantises it (`DynamicQuantizeLinear`): uint8, its
range `[min(0, lowest), max(0, highest)]` over what the convolution is given at once, row by row
of a batch (each session's own: a segment's samples do not depend on what it is batched with).
In the streamed decoder that is a block of the segment's frames (and the samples its cache
carries): the blocks are fixed per segment (`streamed.blocks`), so the samples of a segment still
do not depend on how they are asked for. oneDNN is given the quantised input with scale 1 and no
zero point, so that one call serves rows of different scales: each row's output is then scaled
by its own scale, less its zero point times the weights' sums (`_sums`), and the bias added.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from model_server.engines.streaming import effective_weight

_LEVELS = 255  # uint8


def available() -> bool:
    """Whether this torch has oneDNN's quantized convolution on the CPU."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.onednn, "qconv_pointwise")


class Int8Conv:
    """A valid 1-d convolution (the padding is the stream's `Pad`), computed in int8: call it
    with (1, channels, steps) float32, get the float32 output."""

    def __init__(self, module: nn.Conv1d) -> None:
        weight = effective_weight(module).detach().float()
        channels = weight.shape[0]
        scales = (weight.abs().amax(dim=(1, 2)) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        quantised = torch.round(weight / scales[:, None, None]).clamp(-127, 127).to(torch.int8)
        self.stride, self.dilation = int(module.stride[0]), int(module.dilation[0])
        self.groups = int(module.groups)
        self._scales = scales
        self._zero_points = torch.zeros(channels, dtype=torch.int64)
        self._bias = None if module.bias is None else module.bias.detach().float().view(1, -1, 1)
        # what a zero point of 1 adds to each output channel: its weights' sum, dequantised
        self._sums = (quantised.double().sum(dim=(1, 2)) * scales.double()).float().view(1, -1, 1)
        # oneDNN's packed layout: it does not depend on the input's scale given here
        self._packed = torch.ops.onednn.qconv_prepack(
            quantised, scales, 1.0, 0, [self.stride], [0], [self.dilation], self.groups, None
        )

    def __call__(self, x: Tensor) -> Tensor:
        # each row's range (amin and amax over its channels and steps: several times faster
        # than aminmax on the strided windows the streamed convolutions give)
        lowest, highest = x.amin(dim=(1, 2)).double(), x.amax(dim=(1, 2)).double()
        lowest, highest = lowest.clamp(max=0.0), highest.clamp(min=0.0)
        scale = torch.where(highest > lowest, (highest - lowest) / _LEVELS, 1.0)
        zero_point = (-lowest / scale).round().clamp(0, _LEVELS)
        rows = (-1, 1, 1)
        qx = (
            x.mul((1 / scale).float().view(rows))
            .round_()
            .add_(zero_point.float().view(rows))
            .clamp_(0, _LEVELS)
            .to(torch.uint8)
        )
        out = torch.ops.onednn.qconv_pointwise(
            qx,
            1.0,
            0,
            self._packed,
            self._scales,
            self._zero_points,
            None,
            [self.stride],
            [0],
            [self.dilation],
            self.groups,
            1.0,
            0,
            torch.float32,
            "none",
            [],
            "",
        )
        scaled = scale.float().view(rows)
        shift = zero_point.float().view(rows) * self._sums * scaled
        if self._bias is not None:
            shift = shift - self._bias
        return out.mul_(scaled).sub_(shift)


class Int8Convs:
    """Each convolution's `Int8Conv`, made once (its weights quantised and packed) and shared
    by every stream of the decoder: `kernel(module)`."""

    def __init__(self) -> None:
        self._made: dict[nn.Module, Int8Conv] = {}

    def kernel(self, module: nn.Conv1d) -> Int8Conv:
        made = self._made.get(module)
        if made is None:
            made = self._made[module] = Int8Conv(module)
        return made
