"""The demo page (`/`), the browser module (`/static/speak.js`) and the voices it offers."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse

from gateway import openapi
from gateway.routes.common import service_of
from gateway.service.voices import public_listing

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/v1/voices", responses=openapi.VOICES)
async def voices(request: Request) -> JSONResponse:
    """The model servers' voices, for pickers: their last answer, asked again every 30 s (a
    502 only while none has answered yet), without paths."""
    return JSONResponse(public_listing(await service_of(request).replies.voices.listing()))
