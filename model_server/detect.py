"""What `--engine auto` looks at, on this machine: a CUDA device torch can use, a Kokoro
checkpoint at hand (`--model-dir`, `KOKORO_MODEL_DIR`, the Hugging Face cache), and the hub.
The choice itself is `engine_choice.choose_engine`, a pure function of these."""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

from model_server.engine_choice import HUB_REPO, Detected
from model_server.engines import checkpoint
from model_server.errors import ModelUnavailable

log = logging.getLogger(__name__)


def cuda_device() -> str | None:
    try:
        import torch
    except ImportError:
        return None  # the torch extra is not installed
    with contextlib.suppress(Exception):  # a broken driver is "no device" here
        if torch.cuda.is_available():
            return f"cuda:0 ({torch.cuda.get_device_name(0)})"
    return None


def checkpoint_dir(model_dir: Path) -> Path | None:
    for candidate in (model_dir, os.environ.get("KOKORO_MODEL_DIR")):
        if not candidate:
            continue
        with contextlib.suppress(ModelUnavailable):
            checkpoint.locate(Path(candidate).expanduser())
            return Path(candidate).expanduser()
    return None


def repo_cached() -> bool:
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        return False
    try:
        snapshot_download(HUB_REPO, local_files_only=True)
    except Exception:
        return False
    return True


def hub_reachable() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    import httpx

    try:
        r = httpx.head(f"https://huggingface.co/api/models/{HUB_REPO}", timeout=3.0)
    except httpx.HTTPError:
        return False
    return r.status_code < 400


def detect(model_dir: Path) -> Detected:
    cuda = cuda_device()
    found = checkpoint_dir(model_dir)
    cached = found is None and cuda is not None and repo_cached()
    reachable = found is None and not cached and cuda is not None and hub_reachable()
    return Detected(cuda, found, cached, reachable)
