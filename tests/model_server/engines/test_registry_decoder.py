"""Kokoro's torch decoder with the registry's real weights (`registry_decoder`): every
parameter read back once from the int8 graph's decoder, dequantized, and the torch decoder
computing what the graph's float twin computes, on the front graph's inputs for a real
sentence. No timing in any assertion.

The graph and torch differ in two fixed operators, not in weights (docs/measured.md,
"2026-12-06, later: the same with the registry's real weights, and what the norms cost"): the
source's STFT, whose bins are rounding noise where the graph's source is constant (their phase
is whatever each FFT's rounding gives), and the iSTFT (the graph's is torch.istft times
`GRAPH_GAIN`). So torch is given the graph's source spectrum, and its audio is compared through
the graph's own iSTFT and with that gain."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from model_server.engines import registry_decoder
from model_server.engines.registry_decoder import MappingError

torch = pytest.importorskip("torch", reason="the torch extra is part of `make setup`")
onnx = pytest.importorskip("onnx")

pytestmark = pytest.mark.real_model

HELLO = "həlˈO ðˈɛɹ."


@pytest.fixture(autouse=True, scope="module")
def two_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def graph() -> Any:
    from model_server.engines import weights

    return onnx.load(str(weights.assemble_model(weights.default_cache_dir())))


@pytest.fixture(scope="module")
def found(graph: Any) -> dict[str, Any]:
    return registry_decoder.registry_parameters(graph)


@pytest.fixture(scope="module")
def real() -> Any:
    """The bench's real model: the front graph, the int8 decoder and its float twin, the torch
    decoder with the registry's weights (`registry_decoder.registry_decoder`)."""
    from bench import bench_streaming as bench

    return bench.load(threads=2)


def test_every_parameter_of_the_decoder_is_given_once_with_its_shape(
    found: dict[str, Any], real: Any
) -> None:
    decoder = real.decoder
    wanted = registry_decoder.expected_parameters(decoder)
    assert set(found) == set(wanted)
    assert all(tuple(found[name][0].shape) == shape for name, shape in wanted.items())
    sources = {source for _, source in found.values()}
    assert sum(1 for s in sources if s.endswith("/Conv_quant")) == 68  # every ConvInteger
    assert sum(1 for s in sources if s.endswith("/Gemm_MatMul_quant")) == 58  # every AdaIN fc
    assert all(np.isfinite(v).all() for v, _ in found.values())
    registry_decoder.load_parameters(decoder, found)
    # weight-normed modules compute the graph's weight (a channel quantized to zeros included)
    from model_server.engines.streaming import effective_weight

    for name in ("encode.conv2", "decode.3.pool", "generator.ups.0", "generator.conv_post"):
        module = dict(decoder.named_modules())[name]
        torch.testing.assert_close(
            effective_weight(module), torch.from_numpy(found[f"{name}.weight"][0].copy())
        )


def test_a_mapping_with_a_parameter_missing_extra_or_misshapen_is_refused(
    found: dict[str, Any], real: Any
) -> None:
    decoder = real.decoder  # refused before any parameter is set
    missing = {k: v for k, v in found.items() if k != "generator.ups.1.bias"}
    with pytest.raises(MappingError, match=r"1 missing \['generator.ups.1.bias'\]"):
        registry_decoder.load_parameters(decoder, missing)
    extra = found | {"generator.ups.2.bias": found["generator.ups.1.bias"]}
    with pytest.raises(MappingError, match=r"1 extra \['generator.ups.2.bias'\]"):
        registry_decoder.load_parameters(decoder, extra)
    value, source = found["encode.conv1.bias"]
    wrong = found | {"encode.conv1.bias": (value[:-1], source)}
    with pytest.raises(MappingError, match="1 of another shape"):
        registry_decoder.load_parameters(decoder, wrong)


def test_a_parameter_given_by_two_nodes_is_refused(graph: Any) -> None:
    twice = onnx.ModelProto()
    twice.CopyFrom(graph)
    conv = next(n for n in twice.graph.node if n.name.endswith("/generator/ups.0/ConvTranspose"))
    copy = onnx.NodeProto()
    copy.CopyFrom(conv)
    copy.output[0] = "copy_of_ups.0"
    twice.graph.node.append(copy)
    with pytest.raises(MappingError, match=r"generator.ups.0.weight given twice"):
        registry_decoder.registry_parameters(twice)


def test_the_torch_decoder_with_the_registry_weights_is_the_graphs_float_twin(real: Any) -> None:
    """On the front graph's inputs for "Hello there." (jm_kumo): conv_post's output and the
    audio against the float twin's (measured: 122.8 dB and 95.8 dB);
    the int8 graph itself renders its activations with per-call scales (18 dB from its twin)."""
    from bench import bench_streaming as bench

    inputs = real.inputs(HELLO)
    twin, spectrum, post = real.graph_audio(real.twin, inputs)
    segment = bench.whole_call(real, inputs, spectrum)
    assert segment.audio.shape == twin.shape == (segment.frames * 600,)
    assert bench.snr_db(post, segment.post) >= 100.0
    assert bench.snr_db(twin, real.graph_istft(segment.post)) >= 80.0
    # the graph's iSTFT is torch's times GRAPH_GAIN
    assert bench.snr_db(twin, registry_decoder.GRAPH_GAIN * segment.audio) >= 80.0
    assert bench.snr_db(twin, segment.audio) < 10.0
    int8, _, _ = real.graph_audio(real.int8, inputs)
    assert 10.0 <= bench.snr_db(int8, twin) < 40.0  # close, not the same: per-call scales
