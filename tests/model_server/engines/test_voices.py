from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from kokoro_contract.limits import check_voice
from model_server.engines.voices import Packs, VoicePackError, load_dir, load_file


def _pack(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((510, 1, 256)).astype(np.float32)


def test_every_supported_file_type_loads(tmp_path: Path) -> None:
    np.save(tmp_path / "af_npy.npy", _pack(1))
    np.savez(tmp_path / "bundle.npz", af_one=_pack(2), am_two=_pack(3).reshape(510, 256))
    (tmp_path / "af_raw.bin").write_bytes(_pack(4).astype("<f4").tobytes())
    with (tmp_path / "onnx-voices.bin").open("wb") as f:  # kokoro-onnx's voices-v1.0.bin
        np.savez(f, bf_zip=_pack(5))
    (tmp_path / "notes.txt").write_text("not a voice")
    voices = load_dir(tmp_path)
    assert sorted(voices) == ["af_npy", "af_one", "af_raw", "am_two", "bf_zip"]
    for name, seed in [("af_npy", 1), ("af_one", 2), ("am_two", 3), ("af_raw", 4), ("bf_zip", 5)]:
        assert voices[name].shape == (510, 1, 256)
        np.testing.assert_array_equal(voices[name].reshape(510, 256), _pack(seed).reshape(510, 256))


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("short.bin", b"\x00" * 1000, "not a whole number"),
        ("bad.npy", b"garbage", "cannot read"),
        ("voice.wav", b"RIFF", "unsupported"),
    ],
)
def test_bad_files_give_clear_errors(
    tmp_path: Path, name: str, content: bytes, message: str
) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(VoicePackError, match=message):
        load_file(path)


def test_wrong_shape_is_rejected(tmp_path: Path) -> None:
    np.save(tmp_path / "odd.npy", np.zeros((10, 100), np.float32))
    with pytest.raises(VoicePackError, match=r"expected \(N, 1, 256\)"):
        load_file(tmp_path / "odd.npy")


def test_empty_or_missing_dir(tmp_path: Path) -> None:
    with pytest.raises(VoicePackError, match="no voice packs"):
        load_dir(tmp_path)
    with pytest.raises(VoicePackError, match="does not exist"):
        load_dir(tmp_path / "nope")


def test_pt_as_the_kokoro_package_writes_it(tmp_path: Path) -> None:
    import torch

    pack = torch.randn(510, 1, 256)
    torch.save(pack, tmp_path / "af_heart.pt")
    loaded = load_file(tmp_path / "af_heart.pt")["af_heart"]
    np.testing.assert_array_equal(loaded, pack.numpy())


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
def test_pt_views_and_dtypes_read_as_torch_reads_them(tmp_path: Path, dtype: str) -> None:
    import torch

    whole = torch.randn(520, 2, 256).to(getattr(torch, dtype))
    view = whole[7:517, 1:2, :]  # an offset into its storage, strides of a bigger tensor
    torch.save(view, tmp_path / "bf_view.pt")
    loaded = load_file(tmp_path / "bf_view.pt")["bf_view"]
    assert loaded.dtype == np.float32
    np.testing.assert_array_equal(loaded, view.float().numpy())


def test_pt_loads_without_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    pack = torch.randn(510, 1, 256)
    torch.save(pack, tmp_path / "af_heart.pt")
    monkeypatch.setitem(sys.modules, "torch", None)  # as on an image without the torch extra
    np.testing.assert_array_equal(load_file(tmp_path / "af_heart.pt")["af_heart"], pack.numpy())


class _Boom:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (print, ("ran",))


def test_pt_that_is_not_a_tensor_is_refused(tmp_path: Path) -> None:
    import torch

    (tmp_path / "short.pt").write_bytes(b"PK")
    with pytest.raises(VoicePackError, match=r"short\.pt: cannot read"):
        load_file(tmp_path / "short.pt")
    torch.save({"not": "a tensor"}, tmp_path / "dict.pt")
    with pytest.raises(VoicePackError, match=r"dict\.pt: holds a dict"):
        load_file(tmp_path / "dict.pt")
    torch.save(_Boom(), tmp_path / "code.pt")  # a pickle that would call print()
    with pytest.raises(VoicePackError, match=r"code\.pt: not a saved tensor \(it names .*print\)"):
        load_file(tmp_path / "code.pt")


def test_packs_mix_a_blend_by_its_shares_and_keep_the_latest() -> None:
    a, b = np.full((4, 1, 2), 1.0, np.float32), np.full((4, 1, 2), 4.0, np.float32)
    packs = Packs({"af_a": a, "af_b": b})
    name = check_voice("af_a(2)+af_b(1)", {"af_a", "af_b"}, "af_a")
    np.testing.assert_allclose(packs[name], np.full((4, 1, 2), 2.0), rtol=1e-6)  # 2/3 + 4/3
    assert packs[name] is packs[name]  # mixed once, kept
    assert list(packs) == ["af_a", "af_b"]
    assert len(packs) == 2
    assert name not in packs  # `in`: the loaded voices
    with pytest.raises(KeyError):
        packs["af_c"]
    with pytest.raises(KeyError):
        packs["af_a(1)+af_c(1)"]  # a part not loaded
    first = packs[name]
    for k in range(Packs.BLENDS_KEPT):  # as many others: the first is let go, made again
        packs[f"af_a({k + 3})+af_b(1)"]
    assert packs[name] is not first
    np.testing.assert_array_equal(packs[name], first)
