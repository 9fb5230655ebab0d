"""Engines: `onnx` (CPU default, real Kokoro-82M int8 weights) and `torch` (KModel, GPU)."""

from __future__ import annotations

from model_server.engines.base import CancelToken, Engine, FloatAudio

__all__ = ["CancelToken", "Engine", "FloatAudio"]
