"""Engines: `onnx` (CPU default, real Kokoro-82M int8 weights); `torch` drops in beside it."""

from __future__ import annotations

from model_server.engines.base import CancelToken, Engine, FloatAudio

__all__ = ["CancelToken", "Engine", "FloatAudio"]
