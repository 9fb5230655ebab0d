"""`/healthz` (the process is up), `/readyz` (the model server answers), `/metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.routes.common import service_of

router = APIRouter()


@router.get("/healthz")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    service = service_of(request)
    if await service.tts.ready():
        return JSONResponse({"status": "ready", "model_server": service.tts.base_url})
    body = {"status": "not_ready", "model_server": service.tts.base_url}
    return JSONResponse(body, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = service_of(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
