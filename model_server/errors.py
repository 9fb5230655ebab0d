"""Errors reported to clients: a stable code, a message, and whether to retry. Shared by both
services (the gateway's errors derive from `ServiceError`)."""

from __future__ import annotations


class ServiceError(Exception):
    """An error a client is told about. Never carries a traceback to the client."""

    code: str = "internal_error"
    status: int = 500
    retryable: bool = False

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if retryable is not None:
            self.retryable = retryable


class InvalidRequest(ServiceError):
    """The request itself is wrong; sending it again will not help."""

    code = "invalid_request"
    status = 400


class NotReady(ServiceError):
    code = "not_ready"
    status = 503
    retryable = True


class SynthesisFailed(ServiceError):
    code = "synthesis_failed"
    status = 500


class SynthesisCancelled(Exception):
    """An in-flight synthesis was aborted on purpose (cancel or disconnect)."""


class ModelUnavailable(RuntimeError):
    """The model weights cannot be found or are corrupt; raised at start-up."""
