"""The gateway's app factories: the public app (browsers, SDKs) and the internal one
(`/metrics`, detailed readiness, the public app's OpenAPI schema), which share one
`GatewayService`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from gateway.access.keys import MAX_TOKEN_TTL_S
from gateway.access.middleware import AccessMiddleware
from gateway.access.policy import LOCAL_ORIGIN, LOOPBACK_HOSTS, AccessPolicy
from gateway.config import Settings
from gateway.routes import (
    agentcore,
    health,
    lexicons,
    openai_speech,
    pages,
    speak_sse,
    speak_ws,
    tokens,
    twilio,
)
from gateway.service import GatewayService
from kokoro_contract.http_errors import install_error_handlers
from kokoro_contract.listen import is_loopback


def access_policy(settings: Settings, service: GatewayService) -> AccessPolicy:
    """Refuses (ValueError) to serve anonymously beyond loopback unless told to."""
    loopback = is_loopback(settings.host)
    if service.keys is None and not loopback and not settings.allow_anonymous:
        raise ValueError(
            f"listening on {settings.host} (beyond loopback) without API keys: give "
            "--api-keys-file or GATEWAY_API_KEYS, or say --allow-anonymous"
        )
    if not 1 <= settings.token_ttl_s <= MAX_TOKEN_TTL_S:
        raise ValueError(
            f"--token-ttl-s: 1 to {MAX_TOKEN_TTL_S} s (a token cannot be revoked alone)"
        )
    if not loopback and not settings.hosts:
        raise ValueError(
            f"listening on {settings.host} (beyond loopback): give --allowed-hosts, the names "
            "clients reach this gateway by (e.g. voice.example.com), or say --allowed-hosts '*' "
            "to accept any Host header"
        )
    hosts = settings.hosts or sorted(LOOPBACK_HOSTS)
    return AccessPolicy(
        keys=service.keys,
        origins=frozenset(settings.origins),
        local_origins=loopback,
        hosts=frozenset() if hosts == ["*"] else frozenset(hosts),
        max_body_bytes=settings.max_body_bytes,
        max_lexicon_bytes=settings.max_lexicon_bytes,
    )


def create_app(settings: Settings | None = None, sagemaker_http2_transport: Any = None) -> FastAPI:
    """`sagemaker_http2_transport` replaces the HTTP/2 SDK's CRT client (tests, emulators).
    `app.state.internal` is the internal app; `gateway.cli` serves it on its own port."""
    settings = settings or Settings()
    service = GatewayService(settings, sagemaker_http2_transport)
    policy = access_policy(settings, service)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await service.start()
            yield
        finally:
            await service.aclose()

    public_schema = settings.public_openapi  # else on the internal listener only
    app = FastAPI(
        title="Kokoro voice gateway",
        lifespan=lifespan,
        openapi_url="/openapi.json" if public_schema else None,
        docs_url="/docs" if public_schema else None,
        redoc_url=None,
    )
    app.state.service = service
    app.state.internal = create_internal_app(service, app)

    def denied(code: str) -> None:
        service.metrics.errors.labels(code).inc()

    app.add_middleware(
        AccessMiddleware, policy=policy, on_denied=denied, clock=lambda: service.wall_clock()
    )
    app.add_middleware(  # outermost: answers preflights, and adds CORS headers to refusals
        CORSMiddleware,
        allow_origins=settings.origins,
        allow_origin_regex=LOCAL_ORIGIN.pattern if policy.local_origins else None,
        allow_methods=["GET", "POST"],
        allow_headers=["Authorization", "Content-Type"],
        expose_headers=["X-Utterance-Id", "Retry-After"],
    )
    routers = (
        speak_sse,
        speak_ws,
        twilio,
        openai_speech,
        tokens,
        health,
        pages,
        lexicons,
        agentcore,
    )
    for module in routers:
        app.include_router(module.router)
    app.state.conversations = agentcore.Conversations()  # AgentCore sessions' turns
    app.mount("/static", StaticFiles(directory=pages.STATIC_DIR), name="static")
    install_error_handlers(app, denied)
    return app


def create_internal_app(service: GatewayService, public: FastAPI) -> FastAPI:
    """For operators, never browsers: `/metrics`, `/readyz` with details, `/healthz`, and the
    public app's schema (`/openapi.json`, `/docs`), which the public listener serves only with
    `--public-openapi`."""
    app = FastAPI(
        title="Kokoro voice gateway (internal)", openapi_url=None, docs_url=None, redoc_url=None
    )
    app.state.service = service
    app.include_router(health.internal)

    async def openapi_json() -> JSONResponse:
        return JSONResponse(public.openapi())

    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{public.title} - docs")

    app.add_api_route("/openapi.json", openapi_json, methods=["GET"], include_in_schema=False)
    app.add_api_route("/docs", docs, methods=["GET"], include_in_schema=False)
    install_error_handlers(app)
    return app
