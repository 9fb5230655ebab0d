"""Errors reported to clients: a stable code, a message, whether to retry, an HTTP status.

Both services raise these (or their own subclasses); `http_errors` answers them as
`{"error": {"code", "message"}}` and the WebSocket routes as error frames. Never a traceback."""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """An error a client is told about: `message` is what the client reads; `detail`, what
    only the log does (an upstream's address, its answer's body)."""

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
        retry_after_s: int | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.retry_after_s = retry_after_s  # answered as Retry-After
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status
        if retryable is not None:
            self.retryable = retryable

    def body(self) -> dict[str, Any]:
        """The HTTP error body."""
        return error_body(self.code, self.message, self.retryable)


class InvalidRequest(ServiceError):
    """The request itself is wrong; sending it again will not help."""

    code = "invalid_request"
    status = 400


class NotReady(ServiceError):
    code = "not_ready"
    status = 503
    retryable = True


def error_body(code: str, message: str, retryable: bool = False) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "retryable": retryable}}


def brief(exc: BaseException) -> str:
    """A failure for a log line: its type and the first line of its text (empty for a timeout:
    httpx's ReadTimeout, asyncio's TimeoutError), at most 200 characters."""
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= 200 else f"{text[:199]}…"
