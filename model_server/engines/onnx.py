"""The default engine: Kokoro-82M int8 ONNX on onnxruntime's CPU provider.

It runs the model's timed variant (`weights.timed_model`): the same audio, and the frames the
model gave each phoneme beside it, for word timings."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from model_server.engines import voices as voice_packs
from model_server.engines.base import (
    SAMPLES_PER_FRAME,
    CancelToken,
    FloatAudio,
    Timed,
    char_durations,
    style_row,
    tokenize,
)
from model_server.engines.weights import (
    DURATIONS_OUTPUT,
    assemble_model,
    default_cache_dir,
    load_vocab,
    timed_model,
)
from model_server.errors import SynthesisCancelled, SynthesisFailed
from model_server.text.split import MAX_PHONEMES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnnxOptions:
    model_path: Path | None = None  # default: assembled from the registry packages
    cache_dir: Path | None = None  # also where the timed variant of a model_path is made
    voices_dir: Path | None = None
    intra_op_threads: int = 0  # 0: all cores
    # threads of a call that starts while another runs: calls side by side then share the
    # cores instead of oversubscribing them (0: the same as intra_op_threads)
    shared_threads: int = 0
    spinning: bool = False  # busy-wait between ops: faster alone, wasteful beside other workers


class OnnxEngine:
    name = "onnx"
    max_phonemes = MAX_PHONEMES

    def __init__(self, options: OnnxOptions) -> None:
        cache_dir = options.cache_dir or default_cache_dir()
        model = timed_model(options.model_path or assemble_model(cache_dir), cache_dir)
        alone = options.intra_op_threads or (os.cpu_count() or 1)
        shared = options.shared_threads or alone
        self._alone = self._session(model, alone, options.spinning)
        self._shared = self._alone if shared == alone else self._session(model, shared, False)
        self._running = 0
        self._lock = threading.Lock()
        self._vocab = load_vocab()
        self._packs, self._origin = voice_packs.load_voices(options.voices_dir)
        self.threads = (alone, shared)
        log.info(
            "onnx engine: %s, %d threads per call (%d beside another), voices %s",
            model,
            alone,
            shared,
            ", ".join(self._packs),
        )

    @staticmethod
    def _session(model: Path, threads: int, spinning: bool) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        return ort.InferenceSession(str(model), sess_options=so, providers=["CPUExecutionProvider"])

    @property
    def description(self) -> str:
        return f"onnx on cpu ({self.threads[0]} threads)"

    def voices(self) -> dict[str, str]:
        return dict(self._origin)

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        return self.infer_timed(phonemes, voice, speed, cancel).audio

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        tokens = tokenize(phonemes, self._vocab, self.max_phonemes)
        if not tokens:
            return Timed(np.zeros(0, np.float32), np.zeros(len(phonemes) + 2, np.int64), 1)
        pack = self._packs[voice]
        style = pack[style_row(len(tokens), len(pack))].reshape(1, -1)
        run_options = ort.RunOptions()
        cancel.on_cancel(lambda: setattr(run_options, "terminate", True))
        if cancel.cancelled:
            raise SynthesisCancelled()
        with self._lock:
            session = self._alone if self._running == 0 else self._shared
            self._running += 1
        try:
            audio, durations = session.run(
                ["audio", DURATIONS_OUTPUT],
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
        finally:
            with self._lock:
                self._running -= 1
        return Timed(
            np.asarray(audio, dtype=np.float32).ravel(),
            char_durations(phonemes, self._vocab, durations),
            SAMPLES_PER_FRAME,
        )
