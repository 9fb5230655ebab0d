"""The model server's app factory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI

from kokoro_contract.http_errors import install_error_handlers
from model_server.access import KeyMiddleware
from model_server.body_limit import BodyLimitMiddleware
from model_server.config import Settings
from model_server.inflight import Inflight, InflightMiddleware
from model_server.metrics import registry_for
from model_server.routes import http, ws
from model_server.service import EngineFactory, ModelService, default_engine_factory
from model_server.text.g2p import G2P, default_g2p


def create_app(
    settings: Settings | None = None,
    engine_factory: EngineFactory = default_engine_factory,
    g2p_factory: Callable[[], G2P] = default_g2p,
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
    app.state.inflight = Inflight()
    app.state.metrics = registry_for(service)
    app.state.bidi_sessions = 0  # open bidirectional sessions (routes/ws.py)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    app.add_middleware(InflightMiddleware, inflight=app.state.inflight)
    if settings.api_key:  # outermost: nothing runs, nothing counts, before the key is right
        app.add_middleware(KeyMiddleware, key=settings.api_key)
    app.include_router(http.router)
    app.include_router(ws.router)

    install_error_handlers(app)
    return app
