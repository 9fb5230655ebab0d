"""The model server's app factory."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from model_server.config import Settings
from model_server.errors import ServiceError
from model_server.routes import http, ws
from model_server.service import EngineFactory, ModelService, default_engine_factory
from model_server.text.g2p import G2P, english_g2p

log = logging.getLogger(__name__)


def error_response(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def create_app(
    settings: Settings | None = None,
    engine_factory: EngineFactory = default_engine_factory,
    g2p_factory: Callable[[], G2P] = english_g2p,
) -> FastAPI:
    settings = settings or Settings()
    service = ModelService(settings, engine_factory, g2p_factory)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Listen at once (so /ping can say 503) and load in the background.
        loading = asyncio.create_task(service.load())
        loading.add_done_callback(lambda t: t.cancelled() or t.exception())
        try:
            yield
        finally:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await loading
            service.close()

    app = FastAPI(
        title="Kokoro model server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = service
    app.include_router(http.router)
    app.include_router(ws.router)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.status, exc.code, exc.message)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(422, "invalid_request", str(exc.errors()))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return error_response(500, "internal_error", "internal server error")

    return app
