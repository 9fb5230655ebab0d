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
range `[min(0, lowest), max(0, highest)]` over what the convolution is given at once. In the
streamed decoder that is a block of the segment's frames (and the samples its cache carries): the
blocks are fixed per segment (`streamed.blocks`), so the samples of a segment still do not depend
on how they are asked for. The output is float, the bias added in the kernel.
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
        self._bias = None if module.bias is None else module.bias.detach().float()
        # oneDNN's packed layout: it does not depend on the input's scale given here
        self._packed = torch.ops.onednn.qconv_prepack(
            quantised, scales, 1.0, 0, [self.stride], [0], [self.dilation], self.groups, None
        )

    def __call__(self, x: Tensor) -> Tensor:
        lowest, highest = (float(v) for v in torch.aminmax(x))
        lowest, highest = min(lowest, 0.0), max(highest, 0.0)
        scale = (highest - lowest) / _LEVELS if highest > lowest else 1.0
        zero_point = min(_LEVELS, max(0, round(-lowest / scale)))
        qx = x.mul(1 / scale).round_().add_(zero_point).clamp_(0, _LEVELS).to(torch.uint8)
        return torch.ops.onednn.qconv_pointwise(
            qx,
            scale,
            zero_point,
            self._packed,
            self._scales,
            self._zero_points,
            self._bias,
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
