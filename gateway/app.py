"""The gateway's app factory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles

from gateway.config import Settings
from gateway.routes import health, openai_speech, pages, speak_sse, speak_ws
from gateway.routes.common import LOCAL_ORIGIN
from gateway.service import GatewayService
from kokoro_contract.http_errors import install_error_handlers


def create_app(settings: Settings | None = None, sagemaker_http2_transport: Any = None) -> FastAPI:
    """`sagemaker_http2_transport` replaces the HTTP/2 SDK's CRT client (tests, emulators)."""
    settings = settings or Settings()
    service = GatewayService(settings, sagemaker_http2_transport)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await service.start()
            yield
        finally:
            await service.aclose()

    app = FastAPI(title="Kokoro voice gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.service = service
    app.add_middleware(
        CORSMiddleware,
        allow_origins=settings.origins,
        allow_origin_regex=LOCAL_ORIGIN.pattern,
        allow_methods=["GET", "POST"],
        allow_headers=["*"],
        expose_headers=["X-Utterance-Id"],
    )
    for module in (speak_sse, speak_ws, openai_speech, health, pages):
        app.include_router(module.router)
    app.mount("/static", StaticFiles(directory=pages.STATIC_DIR), name="static")

    install_error_handlers(app, lambda code: service.metrics.errors.labels(code).inc())
    return app
