"""The model server's own errors, beside the shared `ServiceError` family."""

from __future__ import annotations

from kokoro_contract.errors import ServiceError


class SynthesisFailed(ServiceError):
    code = "synthesis_failed"
    status = 500


class UnreadableText(ServiceError):
    """Normalisation or G2P failed on this text: the same text would fail again."""

    code = "unreadable_text"
    status = 422


class SynthesisCancelled(Exception):
    """An in-flight synthesis was aborted on purpose (cancel or disconnect)."""


class ModelUnavailable(RuntimeError):
    """The model weights cannot be found or are corrupt; raised at start-up."""
