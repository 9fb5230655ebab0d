"""Pronunciation lexicons (`gateway.service.lexicons`): a client's own, by name, and the
deployment's. With API keys, a key's holder only (a token is refused by access: these routes
are in none of its groups)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from gateway import openapi
from gateway.access.middleware import client_of
from gateway.errors import BadRequest, GatewayError
from gateway.routes.common import json_body, service_of
from kokoro_contract.lexicon import Lexicon

router = APIRouter()


def _summary(lexicon: Lexicon) -> dict[str, object]:
    return {"name": lexicon.name, "version": lexicon.version, "entries": len(lexicon.entries)}


@router.get("/v1/lexicons", responses=openapi.LEXICONS)
async def list_lexicons(request: Request) -> JSONResponse:
    """The deployment's lexicon (`--lexicon-file`; on every reply) and the client's own."""
    lexicons = service_of(request).replies.lexicons
    own = await lexicons.of(client_of(request.scope).name)
    deployment = lexicons.deployment
    return JSONResponse(
        {
            "deployment": _summary(deployment) if deployment is not None else None,
            "lexicons": [_summary(own[name]) for name in sorted(own)],
        }
    )


@router.get("/v1/lexicons/{name}", responses=openapi.LEXICON)
async def get_lexicon(request: Request, name: str) -> JSONResponse:
    """One of the client's lexicons, its entries and version."""
    lexicons = service_of(request).replies.lexicons
    lexicon = await lexicons.get(client_of(request.scope).name, name)
    if lexicon is None:
        raise GatewayError(f"no lexicon {name!r}", code="unknown_lexicon", status=404)
    return JSONResponse({**_summary(lexicon), "entries": dict(lexicon.entries)})


@router.put(
    "/v1/lexicons/{name}",
    responses=openapi.PUT_LEXICON,
    openapi_extra=openapi.PUT_LEXICON_REQUEST,
)
async def put_lexicon(request: Request, name: str) -> JSONResponse:
    """The client's lexicon `name` (`{"entries": {word: "/IPA/" or alias}}`), new or its next
    version; a reply asks for it with `lexicon`, and one begun before keeps the version it
    began with."""
    body = await json_body(request)
    if set(body) != {"entries"}:
        raise BadRequest('the body is {"entries": {word: reading}}', code="invalid_field")
    lexicons = service_of(request).replies.lexicons
    saved = await lexicons.save(client_of(request.scope).name, name, body["entries"])
    return JSONResponse(_summary(saved))


@router.delete("/v1/lexicons/{name}", status_code=204, responses=openapi.DELETE_LEXICON)
async def delete_lexicon(request: Request, name: str) -> Response:
    """The client's lexicon of that name forgotten (404 `unknown_lexicon`: it had none)."""
    lexicons = service_of(request).replies.lexicons
    if not await lexicons.delete(client_of(request.scope).name, name):
        raise GatewayError(f"no lexicon {name!r}", code="unknown_lexicon", status=404)
    return Response(status_code=204)
