"""The engines the model server can run, by name (`--engine`), each with what it can do: the
server loads, checks and describes an engine through this registry, never by comparing names
elsewhere. An engine's own modules (and their heavy imports: onnxruntime, torch) load only
when it is chosen.

What an engine can do is declared twice over, on purpose: here by kind (`Capabilities`, for
people, `--help` and the choice of an engine before any is loaded), and on the loaded engine
(`Engine.two_passes`, `ProgressiveEngine.exact_windows`), which also depends on its options
(the onnx engine loaded with `--progressive off` has no front graph)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from model_server.config import Settings
    from model_server.engines.base import Engine


@dataclass(frozen=True)
class Capabilities:
    devices: tuple[str, ...]  # where it computes
    decoders: tuple[str, ...]  # its progressive decoders (`--decoder`), the default first
    weights: str  # where its weights come from, for people
    needs: str  # what must be installed beside the base image, for people ("": nothing)


@dataclass(frozen=True)
class EngineKind:
    name: str
    capabilities: Capabilities
    load: Callable[[Settings], Engine]  # the engine, loaded (blocking: off the event loop)
    preflight: Callable[[Settings], None]  # fails at once when its weights are not at hand
    cuda: bool  # may use CUDA: the container's CUDA compatibility check runs before it loads


def _load_onnx(settings: Settings) -> Engine:
    from model_server.engines.onnx import OnnxEngine, OnnxOptions

    return OnnxEngine(
        OnnxOptions(
            model_path=settings.model_path,
            cache_dir=settings.cache_dir,
            voices_dir=settings.voices_dir,
            english_voices=settings.english_voices,
            intra_op_threads=settings.engine_threads,
            decoder_threads=settings.decoder_threads,
            shared_threads=settings.shared_threads,
            progressive=settings.progressive,
            decoder=settings.decoder,
            batch=settings.batch_policy,
        )
    )


def _preflight_onnx(settings: Settings) -> None:
    """The registry's weights, joined and checked (a no-op once they are in the cache)."""
    from model_server.engines.weights import assemble_model, default_cache_dir

    if settings.model_path is None:
        assemble_model(settings.cache_dir or default_cache_dir())


def _load_torch(settings: Settings) -> Engine:
    from model_server.engines.kmodel import TorchEngine, TorchOptions

    return TorchEngine(
        TorchOptions(
            model_dir=settings.model_dir,
            model_repo=settings.model_repo,
            voices_dir=settings.voices_dir,
            device=settings.device,
            threads=settings.threads,
            cache_dir=settings.cache_dir,
            decoder=settings.decoder,
            batch=settings.batch_policy,
        )
    )


def _preflight_torch(settings: Settings) -> None:
    """The checkpoint directory's files (a hub download is left to the background load: /ping
    must answer meanwhile)."""
    from model_server.engines import checkpoint

    if not settings.model_repo:
        checkpoint.locate(settings.model_dir)


ENGINES: dict[str, EngineKind] = {
    kind.name: kind
    for kind in (
        EngineKind(
            "onnx",
            Capabilities(
                devices=("cpu",),
                decoders=("stream", "windows"),
                weights="the registry's int8 graph (sha256-checked)",
                needs="torch and kokoro for the stream decoder (else windows)",
            ),
            _load_onnx,
            _preflight_onnx,
            cuda=False,
        ),
        EngineKind(
            "torch",
            Capabilities(
                devices=("cuda", "cpu"),
                decoders=("stream", "windows"),
                weights="a Kokoro checkpoint (a directory or a hub repo)",
                needs="the torch extra (torch, kokoro)",
            ),
            _load_torch,
            _preflight_torch,
            cuda=True,
        ),
    )
}


# every engine's progressive decoders (`--decoder`, beside auto: each engine's default)
DECODERS = tuple(dict.fromkeys(d for kind in ENGINES.values() for d in kind.capabilities.decoders))


def engine_kind(name: str) -> EngineKind:
    """The engine named `name`; `ValueError` naming the others when there is none."""
    kind = ENGINES.get(name)
    if kind is None:
        raise ValueError(f"unknown engine {name!r}; one of {', '.join(ENGINES)}")
    return kind
