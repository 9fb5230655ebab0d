"""The gateway's errors: the shared `ServiceError` shape (code, message, status, retryable)."""

from __future__ import annotations

from kokoro_contract.errors import ServiceError


class GatewayError(ServiceError):
    pass


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


class Overloaded(GatewayError):
    """Every model server is too busy to give a new reply its first audio in time."""

    code = "overloaded"
    status = 503
    retryable = True
