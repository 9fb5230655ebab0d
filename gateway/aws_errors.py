"""AWS errors at the edge, one translation for every AWS hop (Bedrock, SageMaker's response
stream, SageMaker's bidirectional stream): the service's error code and message, whether it is
worth retrying, and which setting to check."""

from __future__ import annotations

import re

from botocore.exceptions import ClientError

from gateway.errors import LLMError, TTSError

# Codes as the services send them, first letter upper-cased (event streams use camelCase).
RETRYABLE = frozenset(
    {
        "ThrottlingException",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "ServiceUnavailableError",
        "InternalFailure",
        "InternalServerError",
        "InternalServerException",
        "InternalStreamFailure",
        "ModelNotReadyException",  # retryable in bedrock-runtime's service model
        "ModelTimeoutException",  # HTTP 408: the model took too long; another try may not
        "ModelStreamError",
        "ModelStreamErrorException",
    }
)
_BEDROCK_HINTS = {
    "ValidationException": "check GATEWAY_BEDROCK_MODEL_ID and the inference settings",
    "ResourceNotFoundException": "check GATEWAY_BEDROCK_MODEL_ID and GATEWAY_AWS_REGION",
    "AccessDeniedException": (
        "check the AWS credentials and model access for GATEWAY_BEDROCK_MODEL_ID"
    ),
    "UnrecognizedClientException": "check the AWS credentials",
}


# the HTTP/2 SDK's generic CallError names an error it has no class for only in its message:
# "... - status: 400 - id: com.amazonaws.sagemakerruntimehttp2#ThrottlingException"
_SHAPE_ID = re.compile(r"\bid: [\w.]+#(\w+)")


def describe(exc: Exception) -> tuple[str, str]:
    """(code, message) of a botocore `ClientError` or an HTTP/2 SDK exception."""
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        return error.get("Code", "Unknown"), error.get("Message", str(exc))
    message = getattr(exc, "message", None) or str(exc)
    named = _SHAPE_ID.search(message)
    return (named.group(1) if named else type(exc).__name__), message


def retryable(code: str) -> bool:
    return code[:1].upper() + code[1:] in RETRYABLE


def sagemaker_error(exc: Exception, endpoint: str) -> TTSError:
    if isinstance(exc, TTSError):
        return exc
    code, message = describe(exc)
    # the HTTP/2 SDK names the service's error only inside its message
    validation = "Validation" in f"{code} {message}"
    hint = " (check GATEWAY_SAGEMAKER_ENDPOINT and GATEWAY_AWS_REGION)" if validation else ""
    return TTSError(
        f"SageMaker answered {code}",
        code=f"tts_{code}",
        retryable=retryable(code),
        detail=f"SageMaker {code} on endpoint {endpoint!r}: {message}{hint}",
    )


def bedrock_error(exc: Exception, model_id: str) -> LLMError:
    code, message = describe(exc)
    hint = _BEDROCK_HINTS.get(code)
    text = f"Bedrock {code}: {message}" + (f" ({hint}; model {model_id!r})" if hint else "")
    return LLMError(f"Bedrock answered {code}", retryable=retryable(code), detail=text)
