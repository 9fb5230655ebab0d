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
    ready, tts = await service.tts_ready()
    if ready:
        return JSONResponse({"status": "ready", "tts": tts})
    return JSONResponse({"status": "not_ready", "tts": tts}, status_code=503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = service_of(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
