"""`/healthz` (the process is up) and `/readyz` (the model server answers) on the public
listener, without details; the internal listener's `/readyz` names what is checked (and a
fleet's store: `degraded` while it is out of reach), and `/metrics` is served there only."""

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
    status, _ = await _readiness(request)
    ready = status != "not_ready"  # degraded still serves
    return JSONResponse({"status": "ready" if ready else "not_ready"}, 200 if ready else 503)


internal.add_api_route("/healthz", healthz, methods=["GET"])


@internal.get("/readyz")
async def readyz_detail(request: Request) -> JSONResponse:
    status, details = await _readiness(request)
    return JSONResponse({"status": status, **details}, 503 if status == "not_ready" else 200)


async def _readiness(request: Request) -> tuple[str, dict[str, object]]:
    """`ready`; `degraded` (it serves, a fleet's gateway counting alone while its Redis is
    out of reach); `not_ready` (no model server answers, or that Redis with
    `--redis-required`)."""
    service = service_of(request)
    ready, tts = await service.runtime.tts_ready()
    details: dict[str, object] = {"tts": tts}
    store = service.runtime.store
    status = "ready" if ready else "not_ready"
    if store is not None:
        details["fleet"] = {"state": "up" if store.up else "degraded", "reason": store.reason}
        if not store.up and ready:
            status = "not_ready" if service.settings.redis_required else "degraded"
    return status, details


@internal.get("/metrics")
async def metrics(request: Request) -> Response:
    registry = service_of(request).metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
