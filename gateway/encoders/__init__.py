"""One continuous encoder per response: s16le 24 kHz mono PCM in, whole codec units out."""

from __future__ import annotations

from gateway.encoders.base import FORMATS, Encoder, EncoderError, create_encoder

__all__ = ["FORMATS", "Encoder", "EncoderError", "create_encoder"]
