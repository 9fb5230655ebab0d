"""HTTP errors as `{"error": {"code", "message"}}`, never a traceback; for both services."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kokoro_contract.errors import ServiceError, error_body

log = logging.getLogger(__name__)


def error_response(
    status: int, code: str, message: str, retryable: bool = False, retry_after_s: int | None = None
) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse(error_body(code, message, retryable), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI, on_error: Callable[[str], None] | None = None) -> None:
    """`on_error(code)` is told of every error answered (for metrics)."""

    def answer(
        status: int,
        code: str,
        message: str,
        retryable: bool = False,
        retry_after: int | None = None,
    ) -> JSONResponse:
        if on_error is not None:
            on_error(code)
        return error_response(status, code, message, retryable, retry_after)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        if exc.detail:  # an upstream's address and answer: for the operator only
            log.warning("%s %s: %s", request.method, request.url.path, exc.detail)
        return answer(exc.status, exc.code, exc.message, exc.retryable, exc.retry_after_s)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return answer(exc.status_code, code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return answer(422, "invalid_request", str(exc.errors()))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return answer(500, "internal_error", "internal server error")
