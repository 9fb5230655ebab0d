"""The GPU engine: the `kokoro` package's KModel on torch, on CUDA when there is one.

Weights come from a checkpoint directory or a hub repo (see `checkpoint`). Voice packs: the
registry's packaged voices, the checkpoint's `voices/`, then `--voices-dir`, later ones winning.

Several sessions keep the GPU busy at once: the scheduler runs up to `workers` segments in
parallel threads, and on CUDA each thread issues its kernels on a stream of its own, so one
segment's kernels overlap another's host-side work and launches instead of queueing behind them.
"""

from __future__ import annotations

import logging
import math
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from model_server.cuda_compat import DRIVER_FILE
from model_server.engines import checkpoint
from model_server.engines import voices as voice_packs
from model_server.engines.base import (
    CancelToken,
    FloatAudio,
    Timed,
    char_durations,
    style_row,
    tokenize,
)
from model_server.errors import ModelUnavailable, SynthesisCancelled, SynthesisFailed

log = logging.getLogger(__name__)

MIN_TORCH = (2, 10)  # older releases carry PYSEC-2026-2286


@dataclass(frozen=True)
class TorchOptions:
    model_dir: Path = checkpoint.SAGEMAKER_MODEL_DIR
    model_repo: str | None = None  # a hub repo id, instead of model_dir
    voices_dir: Path | None = None
    device: str = "auto"  # auto: cuda when available, else cpu
    threads: int = 0  # torch intra-op threads on the CPU; 0: torch's default


def torch_version_ok(version: str) -> bool:
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return (major, minor) >= MIN_TORCH


def _resolve_device(torch: Any, requested: str) -> Any:
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if DRIVER_FILE.exists():
            log.warning("an NVIDIA driver is loaded but torch sees no CUDA device: using the CPU")
        return torch.device("cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelUnavailable(f"--device {requested}: torch sees no CUDA device")
    return device


def frame_samples(config: dict[str, Any]) -> int:
    """Samples of audio per frame of `pred_dur`: the decoder upsamples 2x, the generator by its
    upsample rates, and its iSTFT hop makes samples (2 x 10 x 6 x 5 = 600 for Kokoro-82M)."""
    istft = config["istftnet"]
    return 2 * math.prod(int(r) for r in istft["upsample_rates"]) * int(istft["gen_istft_hop_size"])


class TorchEngine:
    name = "torch"

    def __init__(self, options: TorchOptions) -> None:
        try:
            import torch
            from kokoro import KModel
        except ImportError as exc:
            raise ModelUnavailable(
                f"the torch engine needs the `torch` extra (kokoro, torch): {exc}"
            ) from exc
        if not torch_version_ok(torch.__version__):
            raise ModelUnavailable(
                f"torch {torch.__version__} is too old: {'.'.join(map(str, MIN_TORCH))} or newer "
                "is required (PYSEC-2026-2286)"
            )
        self._torch: Any = torch  # imported here: the onnx engine must not need it
        directory = (
            checkpoint.download(options.model_repo) if options.model_repo else options.model_dir
        )
        files = checkpoint.locate(directory)
        config = checkpoint.read_config(files.config)
        self._device = _resolve_device(torch, options.device)
        if self._device.type == "cpu" and options.threads:
            torch.set_num_threads(options.threads)
        self._model = self._load(KModel, config, files.weights, options.model_repo)
        self._vocab: dict[str, int] = {str(k): int(v) for k, v in config["vocab"].items()}
        self.max_phonemes = int(self._model.context_length) - 2  # BOS and EOS pads
        self.frame_samples = frame_samples(config)

        packs, self._origin = voice_packs.load_voices(files.voices_dir, options.voices_dir)
        self._packs: dict[str, Any] = {  # name -> (N, 1, 256) tensor on the device
            name: torch.from_numpy(np.ascontiguousarray(pack)).to(self._device)
            for name, pack in packs.items()
        }
        self._streams = threading.local()
        log.info(
            "torch engine: %s on %s (torch %s), voices %s",
            files.weights,
            self._device,
            torch.__version__,
            ", ".join(self._packs),
        )

    def _load(self, kmodel: Any, config: dict[str, Any], weights: Path, repo: str | None) -> Any:
        torch = self._torch
        try:  # mapped, not read: this copy is only looked at; KModel reads its own
            state = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            try:  # the legacy (pre-zip) format cannot be mapped
                state = torch.load(weights, map_location="cpu", weights_only=True)
            except Exception as exc:
                raise ModelUnavailable(f"{weights}: not a torch checkpoint: {exc}") from exc
        checkpoint.check_structure(weights, state)
        try:
            # KModel loads the weights itself; it falls back to a partial load without a word,
            # so the checkpoint is checked against the built model's parameters below.
            with warnings.catch_warnings():  # kokoro builds its decoder with the old weight_norm
                warnings.filterwarnings("ignore", ".*weight_norm.* is deprecated", FutureWarning)
                model = kmodel(
                    repo_id=repo or "hexgrad/Kokoro-82M", config=config, model=str(weights)
                )
        except Exception as exc:  # size mismatches surface here
            raise ModelUnavailable(
                f"{weights.name} does not match {checkpoint.CONFIG_FILE}: {exc}"
            ) from exc
        expected = {
            component: {
                name: tuple(param.shape)
                for name, param in getattr(model, component).named_parameters()
            }
            for component in checkpoint.COMPONENTS
        }
        checkpoint.check_components(weights, state, expected)
        return model.to(self._device).eval()

    @property
    def description(self) -> str:
        device = self._device
        if device.type == "cuda":
            index = device.index or 0
            return f"torch on cuda:{index} ({self._torch.cuda.get_device_name(index)})"
        return f"torch on {device.type}"

    def voices(self) -> dict[str, str]:
        return dict(self._origin)

    @contextmanager
    def _stream(self) -> Iterator[None]:
        """A CUDA stream per worker thread; nothing on the CPU."""
        if self._device.type != "cuda":
            yield
            return
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            stream = self._streams.stream = self._torch.cuda.Stream(device=self._device)
        with self._torch.cuda.stream(stream):
            yield

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        return self.infer_timed(phonemes, voice, speed, cancel).audio

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        tokens = tokenize(phonemes, self._vocab, self.max_phonemes)
        if not tokens:
            return Timed(np.zeros(0, np.float32), np.zeros(len(phonemes) + 2, np.int64), 1)
        if cancel.cancelled:  # a running forward cannot be interrupted; a queued one can
            raise SynthesisCancelled()
        torch = self._torch
        pack = self._packs[voice]
        try:
            with torch.inference_mode(), self._stream():
                ids = torch.tensor([[0, *tokens, 0]], dtype=torch.long, device=self._device)
                style = pack[style_row(len(tokens), len(pack))]  # (1, 256)
                audio, pred_dur = self._model.forward_with_tokens(ids, style, speed)
                out = audio.float().cpu().numpy()  # waits for this thread's stream only
                frames = pred_dur.cpu().numpy()
        except Exception as exc:
            raise SynthesisFailed(f"torch failed: {exc}") from exc
        if cancel.cancelled:
            raise SynthesisCancelled()
        durations = char_durations(phonemes, self._vocab, frames)
        return Timed(out.ravel(), durations, self.frame_samples)
