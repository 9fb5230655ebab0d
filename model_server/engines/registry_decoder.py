"""Kokoro's torch `Decoder` with the registry's weights: the sha256-checked int8 ONNX graph's
decoder, dequantized to float.

The registry ships Kokoro-82M only as an int8 ONNX graph (`weights`). Its decoder's nodes carry
kokoro's module paths (`/decoder/decoder/encode/conv1/Conv_quant`, `.../norm1/fc/...`), so each
of the torch decoder's parameters is read back from the node that uses it:

- the 68 convolutions quantized per tensor (`ConvInteger` behind a `DynamicQuantizeLinear` of
  its input): weight = (q - zero point) x scale, the scale found where the graph multiplies it
  by the input's scale; the bias, which the graph quantizes per call (floored, by the product
  of both scales), taken as the float it divides;
- the 58 AdaIN style projections (`MatMulInteger`, per output channel): the same, transposed;
  their bias the float `Add` after them;
- the float `Conv`/`ConvTranspose` (`pool`, `ups.0`, `ups.1`, `conv_post`: weight norm already
  folded into their weight), the Snake `alpha`s (the `Mul` before each `Sin`), the harmonic
  source's `l_linear`;
- the instance norms' affine weight and bias: the graph's AdaIN scales the normalised input by
  the style alone (Kokoro's norms are affine only for an old exporter's sake, at 1 and 0), so
  they are set to 1 and 0 where the graph shows that shape.

Weight-normed modules get `weight_v` = the weight and `weight_g` = its norm, so that the
effective weight is the graph's. Every parameter of the decoder must be found exactly once, with
its shape: anything else is refused (`MappingError`), naming what is missing or extra.

`float_twin` is the graph's decoder with every quantized convolution and projection replaced by
its float operator over the same dequantized weights: the graph computed as the torch decoder
computes it, for checking one against the other (the int8 graph itself quantizes every
activation with a scale chosen per call, so no float model reproduces it closely). Two fixed
operators differ from torch's, not weights (docs/measured.md, "2026-12-06, later: the same with
the registry's real weights"): the graph's iSTFT is torch.istft times `GRAPH_GAIN`, and its
STFT of the harmonic source rounds differently, which matters where the source is constant
(unvoiced: the graph draws no noise), as all bins but DC are then rounding noise whose phase the
noise branch reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from model_server.engines.norm_graph import topological

if TYPE_CHECKING:
    import onnx
    from torch import nn

Array = npt.NDArray[np.float32]

# Kokoro-82M's config.json: the decoder's part (`KModel` builds `Decoder` from these)
DECODER_CONFIG: dict[str, Any] = {
    "dim_in": 512,  # hidden_dim
    "style_dim": 128,
    "dim_out": 80,  # n_mels
    "resblock_kernel_sizes": [3, 7, 11],
    "upsample_rates": [10, 6],
    "upsample_initial_channel": 512,
    "resblock_dilation_sizes": [[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    "upsample_kernel_sizes": [20, 12],
    "gen_istft_n_fft": 20,
    "gen_istft_hop_size": 5,
}
SCOPE = "/decoder/decoder/"  # the decoder's nodes in the registry graph
# The graph's iSTFT (a transposed convolution over a fixed basis, times 4, cropped) is
# torch.istft times 1.5 (checked on a real conv_post output: docs/measured.md, "2026-12-06,
# later: the same with the registry's real weights"): the registry graph speaks louder than
# kokoro's torch decoder with the same weights by that gain (20 log10 1.5, about 3.5 dB).
GRAPH_GAIN = 1.5
_SNAKE = re.compile(r"^(?P<block>.*)/Sin(?:_(?P<k>\d+))?$")


class MappingError(ValueError):
    """The graph's decoder does not give every parameter of kokoro's `Decoder` exactly once."""


def module_path(scope: str) -> str:
    """kokoro's module path from an exporter's node scope under the decoder: `encode/conv1` ->
    `encode.conv1`; a `Sequential`'s child repeats its parent (`asr_res/asr_res.0` ->
    `asr_res.0`)."""
    parts: list[str] = []
    for part in scope.strip("/").split("/"):
        if parts and part.startswith(parts[-1] + "."):
            parts[-1] = part
        else:
            parts.append(part)
    return ".".join(parts)


@dataclass(frozen=True)
class Quantized:
    """One quantized operator of the graph, read back: the float tensor its input quantizes
    (`x`), the float tensor its scaled output is (`out`), the dequantized weight in the graph's
    layout, the float bias folded into its chain (convolutions only)."""

    node: Any  # the ConvInteger / MatMulInteger NodeProto
    module: str
    x: str
    out: str
    weight: Array
    bias: Array | None


class _Graph:
    def __init__(self, model: onnx.ModelProto) -> None:
        from onnx import numpy_helper

        self.graph = model.graph
        self.inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        self.producer = {out: n for n in model.graph.node for out in n.output}
        self.consumers: dict[str, list[Any]] = {}
        for node in model.graph.node:
            for name in dict.fromkeys(node.input):
                self.consumers.setdefault(name, []).append(node)

    def init(self, name: str, what: str) -> npt.NDArray[Any]:
        if name not in self.inits:
            raise MappingError(f"{what}: {name!r} is not a constant of the graph")
        return self.inits[name]

    def made_by(self, name: str, op: str, what: str) -> Any:
        node = self.producer.get(name)
        if node is None or node.op_type != op:
            raise MappingError(f"{what}: {name!r} is not made by a {op}")
        return node

    def only_consumer(self, name: str, op: str, what: str) -> Any:
        found = self.consumers.get(name, [])
        if len(found) != 1 or found[0].op_type != op:
            raise MappingError(f"{what}: {name!r} is not read by one {op} alone")
        return found[0]

    def scale_of(self, product: str, activation_scale: str, what: str) -> Array:
        """The weight's scale: the constant the input's scale is multiplied by."""
        mul = self.made_by(product, "Mul", what)
        others = [i for i in mul.input if i != activation_scale]
        if len(others) != 1:
            raise MappingError(f"{what}: {product!r} is not the input's scale times a constant")
        return self.init(others[0], what).astype(np.float32)


def _quantized(g: _Graph, node: Any) -> Quantized:
    what = node.name
    quantize = g.made_by(node.input[0], "DynamicQuantizeLinear", what)
    x, activation_scale = quantize.input[0], quantize.output[1]
    q = g.init(node.input[1], what).astype(np.int32)
    zero = g.init(node.input[3], what).astype(np.int32) if len(node.input) > 3 else 0
    after = g.consumers.get(node.output[0], [])
    bias: Array | None = None
    if len(after) == 1 and after[0].op_type == "Add":  # a convolution's bias, quantized per call
        add = after[0]
        other = next(i for i in add.input if i != node.output[0])
        chain = g.made_by(other, "Reshape", what)
        chain = g.made_by(chain.input[0], "Cast", what)
        chain = g.made_by(chain.input[0], "Floor", what)
        divide = g.made_by(chain.input[0], "Div", what)
        bias = g.init(divide.input[0], what).astype(np.float32)
        cast = g.only_consumer(add.output[0], "Cast", what)
    else:
        cast = g.only_consumer(node.output[0], "Cast", what)
    scale_mul = g.only_consumer(cast.output[0], "Mul", what)
    product = next(i for i in scale_mul.input if i != cast.output[0])
    scale = g.scale_of(product, activation_scale, what)
    if node.op_type == "ConvInteger":
        suffix = "/Conv_quant"
        per_channel = scale.reshape(-1, *([1] * (q.ndim - 1))) if scale.size > 1 else scale
        zeros = np.reshape(zero, (-1, *([1] * (q.ndim - 1)))) if np.size(zero) > 1 else zero
    else:  # MatMulInteger: (in, out), per output channel
        suffix = "/Gemm_MatMul_quant"
        per_channel, zeros = scale, zero
    if not node.name.endswith(suffix):
        raise MappingError(f"{what}: not named as kokoro's exporter names a {node.op_type}")
    weight = ((q - zeros) * per_channel).astype(np.float32)
    module = module_path(node.name[len(SCOPE) : -len(suffix)])
    return Quantized(node, module, x, scale_mul.output[0], weight, bias)


def _put(found: dict[str, tuple[Array, str]], name: str, value: Array, source: str) -> None:
    if name in found:
        raise MappingError(f"{name} given twice: by {found[name][1]} and by {source}")
    found[name] = (np.ascontiguousarray(value, dtype=np.float32), source)


def registry_parameters(model: onnx.ModelProto) -> dict[str, tuple[Array, str]]:
    """Each parameter of kokoro's `Decoder` the graph `model` gives (a weight-normed module's
    effective `weight`, not its `weight_g`/`weight_v`), by name under the decoder, with the node
    it came from. `MappingError` when one is given twice or the graph's shape is not the one
    Kokoro's exporter gives."""
    g = _Graph(model)
    found: dict[str, tuple[Array, str]] = {}
    norms: list[tuple[str, str]] = []  # AdaIN modules, and the node that shows their norm
    for node in g.graph.node:
        if not node.name.startswith(SCOPE):
            continue
        if node.op_type in ("ConvInteger", "MatMulInteger"):
            q = _quantized(g, node)
            if node.op_type == "ConvInteger":
                _put(found, f"{q.module}.weight", q.weight, node.name)
                if q.bias is not None:
                    _put(found, f"{q.module}.bias", q.bias, node.name)
            else:
                _put(found, f"{q.module}.weight", q.weight.T, node.name)
                add = g.only_consumer(q.out, "Add", node.name)
                bias = next(i for i in add.input if i != q.out)
                _put(found, f"{q.module}.bias", g.init(bias, node.name), add.name)
        elif node.op_type in ("Conv", "ConvTranspose"):
            scope = node.name[len(SCOPE) :].rsplit("/", 1)[0]
            if scope == "generator/istft/stft":
                continue  # the iSTFT's fixed basis: torch's istft has no parameter
            module = module_path(scope)
            _put(found, f"{module}.weight", g.init(node.input[1], node.name), node.name)
            if len(node.input) > 2 and node.input[2]:
                _put(found, f"{module}.bias", g.init(node.input[2], node.name), node.name)
        elif node.op_type == "Sin" and (m := _SNAKE.match(node.name[len(SCOPE) :])):
            if "/resblocks." not in node.name and "/noise_res." not in node.name:
                continue  # the harmonic source's and the post-net's sines
            k = int(m["k"] or 0)  # Sin, Sin_1, ...: alpha1.0, alpha2.0, alpha1.1, ...
            mul = g.made_by(node.input[0], "Mul", node.name)
            alphas = [i for i in mul.input if i in g.inits]
            if len(alphas) != 1:
                raise MappingError(f"{node.name}: its input is not alpha times x")
            name = f"{module_path(m['block'])}.alpha{k % 2 + 1}.{k // 2}"
            _put(found, name, g.inits[alphas[0]], mul.name)
        elif node.op_type == "MatMul" and node.name.endswith("/m_source/l_linear/MatMul"):
            module = module_path(node.name[len(SCOPE) : -len("/MatMul")])
            _put(found, f"{module}.weight", g.init(node.input[1], node.name).T, node.name)
            add = g.only_consumer(node.output[0], "Add", node.name)
            bias = next(i for i in add.input if i != node.output[0])
            _put(found, f"{module}.bias", g.init(bias, node.name), add.name)
        elif node.op_type == "Div" and node.name.endswith("/Div_1"):
            # an AdaIN's normalised input, read by the style's scale with no affine step
            scope = node.name[len(SCOPE) : -len("/Div_1")]
            if not (scope.split("/")[-1].startswith(("norm", "adain"))):
                continue
            # (the first norms of a stage's three resblocks read the same input: the graph
            # normalises it once, and each AdaIN scales that)
            readers = g.consumers.get(node.output[0], [])
            if not readers or any(r.op_type != "Mul" for r in readers):
                raise MappingError(f"{node.name}: the normalised input has an affine step")
            for reader in readers:
                adain = module_path(reader.name[len(SCOPE) :].rsplit("/", 1)[0])
                norms.append((adain, reader.name))
    for adain, source in norms:  # its `fc` gives (1 + gamma, beta) for each channel
        fc = found.get(f"{adain}.fc.bias")
        if fc is None:
            raise MappingError(f"{source}: no style projection {adain}.fc")
        channels = fc[0].size // 2
        _put(found, f"{adain}.norm.weight", np.ones(channels, np.float32), source)
        _put(found, f"{adain}.norm.bias", np.zeros(channels, np.float32), source)
    return found


def build_decoder() -> nn.Module:
    """kokoro's `Decoder` as Kokoro-82M's config builds it, in eval mode, its parameters
    allocated but not initialised (built on the meta device: kokoro's random initialisation of
    its 54 M weights is slow, and `load_parameters` sets every one)."""
    import warnings

    import torch
    from kokoro.istftnet import Decoder

    with warnings.catch_warnings(), torch.device("meta"):
        warnings.filterwarnings("ignore", ".*weight_norm.* is deprecated", FutureWarning)
        decoder: nn.Module = Decoder(**DECODER_CONFIG)
    decoder = decoder.to_empty(device="cpu")
    stft = decoder.generator.stft  # a plain attribute, not a buffer: made again on the CPU
    stft.window = torch.hann_window(stft.win_length, periodic=True, dtype=torch.float32)
    return decoder.eval()


def expected_parameters(decoder: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every parameter of `decoder` by the name `registry_parameters` gives it (a weight-normed
    module's `weight_g` and `weight_v` as its effective `weight`), with its shape."""
    from model_server.engines.streaming import effective_weight

    modules = dict(decoder.named_modules())
    wanted: dict[str, tuple[int, ...]] = {}
    for name, parameter in decoder.named_parameters():
        owner, _, leaf = name.rpartition(".")
        if leaf in ("weight_g", "weight_v"):
            wanted[f"{owner}.weight"] = tuple(effective_weight(modules[owner]).shape)
        else:
            wanted[name] = tuple(parameter.shape)
    return wanted


def load_parameters(decoder: nn.Module, found: dict[str, tuple[Array, str]]) -> None:
    """Set every parameter of `decoder` from `found` (`registry_parameters`): a weight-normed
    module's `weight_v` to the weight and `weight_g` to its norm. `MappingError`, before any is
    set, when one is missing, extra or of another shape."""
    import torch

    from model_server.engines.streaming import effective_weight

    wanted = expected_parameters(decoder)
    missing = sorted(set(wanted) - set(found))
    extra = sorted(set(found) - set(wanted))
    wrong = [
        f"{n} {found[n][0].shape} for {wanted[n]}"
        for n in sorted(set(wanted) & set(found))
        if tuple(found[n][0].shape) != wanted[n]
    ]
    if missing or extra or wrong:
        raise MappingError(
            "the graph's decoder does not give each parameter once: "
            f"{len(missing)} missing {missing[:5]}, {len(extra)} extra {extra[:5]}, "
            f"{len(wrong)} of another shape {wrong[:5]}"
        )
    modules = dict(decoder.named_modules())
    with torch.no_grad():
        for name, (value, _source) in found.items():
            owner, _, leaf = name.rpartition(".")
            module = modules[owner]
            tensor = torch.from_numpy(value.copy())
            if leaf == "weight" and hasattr(module, "weight_g"):
                dims = tuple(range(1, tensor.ndim))  # kokoro's weight_norm: over all but dim 0
                norm = tensor.norm(dim=dims, keepdim=True)
                # a channel quantized to all zeros (some are): g = 0 over any direction
                module.weight_v.copy_(torch.where(norm > 0, tensor, torch.ones_like(tensor)))
                module.weight_g.copy_(norm)
                module.weight = effective_weight(module)  # as its pre-forward hook sets it
            else:
                getattr(module, leaf).copy_(tensor.view_as(getattr(module, leaf)))


def registry_decoder(model: onnx.ModelProto) -> nn.Module:
    """kokoro's `Decoder` (float32, eval mode) with the graph `model`'s decoder weights,
    dequantized (`registry_parameters`, `load_parameters`)."""
    decoder = build_decoder()
    load_parameters(decoder, registry_parameters(model))
    return decoder


def float_twin(decoder: onnx.ModelProto) -> onnx.ModelProto:
    """The decoder graph `decoder` (the registry graph's, as `weights` cuts it: the decoder's
    inputs -> audio), each quantized operator replaced by its float one over the dequantized
    weight (a `Conv` with the float bias, a `MatMul`): the same model in float, computed as the
    torch decoder computes it. The graph given is not changed."""
    import onnx
    from onnx import helper, numpy_helper

    twin = onnx.ModelProto()
    twin.CopyFrom(decoder)
    g = _Graph(twin)
    added: list[Any] = []
    initializers: list[Any] = []
    for node in list(twin.graph.node):
        if node.op_type not in ("ConvInteger", "MatMulInteger"):
            continue
        q = _quantized(g, node)
        weight = f"twin/{q.module}.weight"
        initializers.append(numpy_helper.from_array(q.weight, weight))
        inputs = [q.x, weight]
        if q.bias is not None:
            initializers.append(numpy_helper.from_array(q.bias, f"twin/{q.module}.bias"))
            inputs.append(f"twin/{q.module}.bias")
        op = "Conv" if node.op_type == "ConvInteger" else "MatMul"
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        added.append(helper.make_node(op, inputs, [q.out], name=f"twin/{q.module}", **attributes))
    # what made the replaced outputs before goes, with whatever only it read
    replaced = {n.output[0] for n in added}
    kept = [n for n in twin.graph.node if not (set(n.output) & replaced)] + added
    needed = {o.name for o in twin.graph.output}
    live: list[Any] = []
    for node in reversed(_topological(kept, {i.name for i in twin.graph.input}, initializers, g)):
        if set(node.output) & needed:
            live.append(node)
            needed.update(node.input)
    del twin.graph.node[:]
    twin.graph.node.extend(reversed(live))
    keep = [i for i in twin.graph.initializer if i.name in needed]
    del twin.graph.initializer[:]
    twin.graph.initializer.extend(keep + [i for i in initializers if i.name in needed])
    return twin


def _topological(nodes: list[Any], inputs: set[str], extra: list[Any], g: _Graph) -> list[Any]:
    try:
        return topological(nodes, inputs | set(g.inits) | {i.name for i in extra}, "the float twin")
    except ValueError as exc:
        raise MappingError(str(exc)) from exc
