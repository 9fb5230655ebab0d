"""Which engine a local stack runs, pure: from what was detected (a CUDA device, a Kokoro
checkpoint at hand, the hub) to the engine and where its weights come from, with the reason.

`--engine auto` (what `make dev` asks for): the torch engine on CUDA when torch sees a device
and a checkpoint is at hand (a directory, the Hugging Face cache, or the hub, fetched once into
the cache); otherwise the int8 ONNX engine on the CPU, whose weights ship in the registry. An
explicit `--engine onnx|torch` always wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HUB_REPO = "hexgrad/Kokoro-82M"


@dataclass(frozen=True)
class Detected:
    cuda: str | None  # the device torch would use, e.g. "cuda:0 (NVIDIA A10G)"; None: none
    model_dir: Path | None  # a Kokoro checkpoint directory at hand (config.json, one .pth)
    cached_repo: bool  # HUB_REPO is complete in the Hugging Face cache
    hub_reachable: bool  # HUB_REPO can be fetched now


@dataclass(frozen=True)
class Choice:
    engine: str  # onnx | torch
    model_dir: Path | None = None
    model_repo: str | None = None
    reason: str = ""


def choose_engine(explicit: str, detected: Detected) -> Choice:
    """`explicit`: the --engine asked for (auto, onnx or torch)."""
    if explicit == "onnx":
        return Choice("onnx", reason="--engine onnx")
    if explicit == "torch":
        if detected.model_dir is not None:
            return Choice("torch", model_dir=detected.model_dir, reason="--engine torch")
        repo = HUB_REPO if detected.cached_repo or detected.hub_reachable else None
        return Choice("torch", model_repo=repo, reason="--engine torch")
    if explicit != "auto":
        raise ValueError(f"unknown engine {explicit!r}; use auto, onnx or torch")
    if detected.cuda is None:
        return Choice("onnx", reason="no CUDA device")
    if detected.model_dir is not None:
        return Choice("torch", model_dir=detected.model_dir, reason=f"{detected.cuda}")
    if detected.cached_repo:
        return Choice("torch", model_repo=HUB_REPO, reason=f"{detected.cuda}, {HUB_REPO} cached")
    if detected.hub_reachable:
        return Choice(
            "torch", model_repo=HUB_REPO, reason=f"{detected.cuda}, {HUB_REPO} from the hub"
        )
    return Choice("onnx", reason=f"{detected.cuda} but no Kokoro checkpoint (KOKORO_MODEL_DIR)")
