"""Kokoro checkpoints in the `kokoro` package's format, for the torch engine.

A checkpoint directory holds what the Hugging Face repo `hexgrad/Kokoro-82M` holds:

    config.json       model dimensions and the phoneme vocab
    kokoro-v1_0.pth   one state dict per component: bert, bert_encoder, predictor,
                      text_encoder, decoder
    voices/NAME.pt    voice packs, (510, 1, 256) tensors

On SageMaker the directory is `/opt/ml/model` (the endpoint's model data, unpacked); images may
bake it in; online machines may name a hub repo instead, which is fetched into the hub cache.
Everything here fails with `ModelUnavailable` and a message that says what to fix, because the
`kokoro` package itself loads a half-matching checkpoint without a word.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_server.errors import ModelUnavailable

SAGEMAKER_MODEL_DIR = Path("/opt/ml/model")
CONFIG_FILE = "config.json"
VOICES_SUBDIR = "voices"
COMPONENTS = ("bert", "bert_encoder", "predictor", "text_encoder", "decoder")
# KModel splits every 256-wide voice style into two halves of 128 (decoder, prosody).
HALF_STYLE_DIM = 128
_CONFIG_KEYS = (
    "vocab",
    "n_token",
    "plbert",
    "hidden_dim",
    "style_dim",
    "n_layer",
    "max_dur",
    "dropout",
    "text_encoder_kernel_size",
    "n_mels",
    "istftnet",
)
_HUB_FILES = [CONFIG_FILE, "*.pth", f"{VOICES_SUBDIR}/*.pt"]


@dataclass(frozen=True)
class CheckpointFiles:
    config: Path
    weights: Path
    voices_dir: Path | None  # `voices/` beside the weights, when there is one


def locate(directory: Path) -> CheckpointFiles:
    """The files of the checkpoint in `directory`."""
    if not directory.is_dir():
        raise ModelUnavailable(
            f"model directory {directory} does not exist: pass --model-dir with a Kokoro "
            f"checkpoint ({CONFIG_FILE}, a .pth file, {VOICES_SUBDIR}/*.pt) or --model-repo"
        )
    config = directory / CONFIG_FILE
    if not config.is_file():
        raise ModelUnavailable(f"{directory} has no {CONFIG_FILE}: not a Kokoro checkpoint")
    weights = sorted(p for p in directory.glob("*.pth") if p.is_file())
    if not weights:
        raise ModelUnavailable(f"{directory} has no .pth weights file (e.g. kokoro-v1_0.pth)")
    if len(weights) > 1:
        names = ", ".join(p.name for p in weights)
        raise ModelUnavailable(f"{directory} has several .pth files ({names}); keep one")
    voices = directory / VOICES_SUBDIR
    return CheckpointFiles(config, weights[0], voices if voices.is_dir() else None)


def download(repo_id: str) -> Path:
    """Fetch the checkpoint files of a hub repo (or find them in the hub cache); its directory.

    Honours the hub's own settings: HF_HUB_OFFLINE, HF_HUB_CACHE, HF_TOKEN."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES))
    except Exception as exc:
        raise ModelUnavailable(
            f"cannot fetch {repo_id!r} from the Hugging Face hub ({type(exc).__name__}: {exc}); "
            "offline machines need --model-dir with a local copy"
        ) from exc


def read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelUnavailable(f"{path}: not a readable JSON config: {exc}") from exc
    if not isinstance(config, dict):
        raise ModelUnavailable(f"{path}: expected a JSON object")
    missing = [key for key in _CONFIG_KEYS if key not in config]
    if missing:
        raise ModelUnavailable(f"{path}: not a Kokoro config, missing {', '.join(missing)}")
    if config["style_dim"] != HALF_STYLE_DIM:
        raise ModelUnavailable(
            f"{path}: style_dim is {config['style_dim']}; Kokoro voice packs need {HALF_STYLE_DIM}"
        )
    if not isinstance(config["vocab"], dict) or not config["vocab"]:
        raise ModelUnavailable(f"{path}: vocab must map phonemes to token ids")
    return config


def _strip(name: str) -> str:
    return name.removeprefix("module.")  # checkpoints saved from DataParallel


def check_structure(path: Path, checkpoint: Any) -> None:
    """One state dict for each of the model's components, and nothing else."""
    if not isinstance(checkpoint, Mapping):
        raise ModelUnavailable(f"{path.name}: expected a dict of state dicts, one per component")
    unknown = sorted(map(str, set(checkpoint) - set(COMPONENTS)))
    if unknown:
        raise ModelUnavailable(f"{path.name}: unknown components {', '.join(unknown)}")
    for component in COMPONENTS:
        if not isinstance(checkpoint.get(component), Mapping):
            raise ModelUnavailable(f"{path.name}: component {component!r} is missing")


def check_components(
    path: Path, checkpoint: Mapping[str, Any], expected: Mapping[str, Mapping[str, tuple[int, ...]]]
) -> None:
    """Every component has every expected weight, in the expected shape (`expected`: component
    -> parameter name -> shape, from a model built from the config). Extra entries, such as
    buffers an older library saved, are left to KModel."""
    for component, shapes in expected.items():
        found = {
            _strip(str(name)): tuple(value.shape) for name, value in checkpoint[component].items()
        }
        missing = sorted(set(shapes) - set(found))
        if missing:
            raise ModelUnavailable(
                f"{path.name}: component {component!r} lacks {len(missing)} weights "
                f"(first: {missing[0]}); the checkpoint does not match {CONFIG_FILE}"
            )
        for name, shape in shapes.items():
            if found[name] != shape:
                raise ModelUnavailable(
                    f"{path.name}: {component}.{name} has shape {found[name]}, the config says "
                    f"{shape}; the checkpoint does not match {CONFIG_FILE}"
                )
