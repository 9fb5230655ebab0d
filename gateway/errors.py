"""Errors the gateway reports to clients: a stable code, a message, whether to retry."""

from __future__ import annotations


class GatewayError(Exception):
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


class BadRequest(GatewayError):
    code = "invalid_request"
    status = 400


class UpstreamError(GatewayError):
    """The LLM or the model server failed."""

    code = "upstream_error"
    status = 502
    retryable = True


class TTSError(UpstreamError):
    code = "tts_error"


class LLMError(UpstreamError):
    code = "llm_error"
