"""The engines' registry (`model_server/engines/registry.py`): every engine by name with what
it can do, the settings' choices drawn from it, and the server asking a loaded engine what it
can do rather than what it is."""

from __future__ import annotations

from pathlib import Path

import pytest

from model_server import cli
from model_server.config import Settings, parse_settings
from model_server.engines.registry import DECODERS, ENGINES, engine_kind
from model_server.errors import ModelUnavailable
from model_server.scheduler import Scheduler
from model_server.synthesis import Synthesizer
from tests.support.fakes import FakeProgressiveEngine, IdentityG2P


def test_every_engine_is_registered_under_its_name_with_its_capabilities() -> None:
    assert list(ENGINES) == ["onnx", "torch"]
    for name, kind in ENGINES.items():
        assert kind.name == name
        assert kind.capabilities.decoders  # both have two passes
        assert set(kind.capabilities.decoders) <= set(DECODERS)
    assert ENGINES["torch"].cuda
    assert not ENGINES["onnx"].cuda
    assert "cuda" in ENGINES["torch"].capabilities.devices
    assert DECODERS == ("stream", "windows")


def test_an_unknown_engine_is_refused_naming_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="'tensorrt'; one of onnx, torch"):
        engine_kind("tensorrt")
    assert engine_kind("torch") is ENGINES["torch"]


def test_the_settings_accept_the_registered_engines_and_decoders_only(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in [*ENGINES, "auto"]:
        assert parse_settings(["--engine", name], env={}).engine == name
    for decoder in ["auto", *DECODERS]:
        assert parse_settings(["--decoder", decoder], env={}).decoder == decoder
    for flag, value in (("--engine", "tensorrt"), ("--decoder", "crossfade")):
        with pytest.raises(SystemExit):
            parse_settings([flag, value], env={})
        assert "invalid choice" in capsys.readouterr().err


def test_the_preflight_is_the_engines_own(tmp_path: Path) -> None:
    """An empty checkpoint directory stops the torch engine's start; the onnx engine's does
    not read it."""
    with pytest.raises(ModelUnavailable, match=r"config\.json"):
        cli.preflight(Settings(engine="torch", model_dir=tmp_path))
    ENGINES["torch"].preflight(Settings(engine="torch", model_dir=tmp_path, model_repo="a/b"))


class _DeclaresOnePass(FakeProgressiveEngine):
    """Has `front` and `decode`, but was loaded without them (as the onnx engine is with
    `--progressive off`): it says so."""

    two_passes = False


def test_the_synthesizer_voices_in_two_passes_only_an_engine_that_says_it_can() -> None:
    two = Synthesizer(FakeProgressiveEngine(), IdentityG2P(), Scheduler(1))
    one = Synthesizer(_DeclaresOnePass(), IdentityG2P(), Scheduler(1))
    assert two.progressive is not None
    assert one.progressive is None
