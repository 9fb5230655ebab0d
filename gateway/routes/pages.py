"""The demo page (`/`), the browser module (`/static/speak.js`) and the voices it offers; a
client's saved blends (`POST /v1/voices`, `DELETE /v1/voices/{name}`)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request, Response
from fastapi.responses import FileResponse, JSONResponse

from gateway import openapi
from gateway.access.keys import Client
from gateway.access.middleware import client_of
from gateway.errors import BadRequest, GatewayError
from gateway.routes.common import json_body, service_of
from gateway.service.voices import public_listing

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
router = APIRouter()


@router.get("/", include_in_schema=False)
async def index() -> FileResponse:
    return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/v1/voices", responses=openapi.VOICES)
async def voices(request: Request) -> JSONResponse:
    """The model servers' voices, for pickers: their last answer, asked again every 30 s (a
    502 only while none has answered yet), without paths; and the client's saved blends."""
    replies = service_of(request).replies
    listing = public_listing(await replies.voices.listing())
    saved = await replies.saved.of(client_of(request.scope).name)
    listing["blends"] = [{"name": name, "blend": blend} for name, blend in sorted(saved.items())]
    return JSONResponse(listing)


@router.post(
    "/v1/voices",
    status_code=201,
    responses=openapi.SAVE_BLEND,
    openapi_extra=openapi.SAVE_BLEND_REQUEST,
)
async def save_blend(request: Request) -> JSONResponse:
    """A blend saved under a name of the client's (`{"name", "blend"}`): the name then speaks
    it on every route, for this client (its API key)."""
    replies = service_of(request).replies
    client = _key_holder(request)
    body = await json_body(request)
    if unknown := set(body) - {"name", "blend"}:
        raise BadRequest(f"unknown fields: {sorted(unknown)}", code="invalid_field")
    blend = body.get("blend")
    if not isinstance(blend, str | list) or not blend:
        raise BadRequest("field 'blend': a blend, as 'af_bella(2)+af_sky(1)'", code="invalid_field")
    canonical = await replies.voices.resolve(blend)
    if canonical is None or "+" not in canonical:
        raise BadRequest("field 'blend': a blend of two voices or more", code="invalid_field")
    known = await replies.voices.known()
    await replies.saved.save(client.name, body.get("name"), canonical, known)
    return JSONResponse({"name": body["name"], "blend": canonical}, status_code=201)


@router.delete("/v1/voices/{name}", status_code=204, responses=openapi.DELETE_BLEND)
async def delete_blend(request: Request, name: str) -> Response:
    """The client's saved blend of that name forgotten (404 `unknown_blend`: it had none)."""
    client = _key_holder(request)
    if not await service_of(request).replies.saved.delete(client.name, name):
        raise GatewayError(f"no saved blend {name!r}", code="unknown_blend", status=404)
    return Response(status_code=204)


def _key_holder(request: Request) -> Client:
    """The caller, when it holds the key (or no key is needed): a token's visitor may list the
    blends and speak them, never change them."""
    client = client_of(request.scope)
    if client.via == "token":
        raise GatewayError(
            "saving or deleting a blend needs the API key; a token may list and speak them",
            code="token_not_for_route",
            status=403,
        )
    return client
