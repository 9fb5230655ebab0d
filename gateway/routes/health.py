"""`/healthz` (the process is up) and `/readyz` (the model server answers) on the public
listener, without details; the internal listener's `/readyz` names what is checked, and
`/metrics` is served there only."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gateway.routes.common import service_of

router = APIRouter()  # the public listener
internal = APIRouter()  # the internal listener


@router.get("/healthz")
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    ready, _ = await service_of(request).runtime.tts_ready()
    return JSONResponse({"status": "ready" if ready else "not_ready"}, 200 if ready else 503)


internal.add_api_route("/healthz", healthz, methods=["GET"])


@internal.get("/readyz")
async def readyz_detail(request: Request) -> JSONResponse:
    service = service_of(request)
    ready, tts = await service.runtime.tts_ready()
    if ready:
        return JSONResponse({"status": "ready", "tts": tts})
    return JSONResponse({"status": "not_ready", "tts": tts}, status_code=503)


@internal.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = service_of(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
