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


# a model server's errors about itself, not the request (an engine's exception, a model file's
# path, a body that is not its JSON): the client reads the code, the log the message
MODEL_SERVER_SIDE = frozenset({"synthesis_failed", "internal_error", "stuck", "not_ready", "error"})


def model_server_error(code: str, message: str, retryable: bool) -> TTSError:
    """A model server's error answer (an HTTP body or a session's error frame) as the reply's:
    its message for the client when it is about the request (a voice, the text), else the log's
    (a refused key: a generic `tts_error` for the client, the cause in the operator's log)."""
    if code in ("unauthorized", "forbidden"):  # this gateway's key: the operator's to fix
        return TTSError(
            "the model server failed",
            retryable=retryable,
            detail=f"model server refused this gateway ({code}: {message}): "
            "check --model-server-key against its --api-key",
        )
    if code in MODEL_SERVER_SIDE:
        return TTSError(
            f"the model server answered {code}",
            code=f"tts_{code}",
            retryable=retryable,
            detail=f"model server: {message}",
        )
    return TTSError(f"model server: {message}", code=f"tts_{code}", retryable=retryable)


class LLMError(UpstreamError):
    code = "llm_error"


class Overloaded(GatewayError):
    """Every model server is too busy to give a new reply its first audio in time."""

    code = "overloaded"
    status = 503
    retryable = True
