"""`POST /v1/tokens`: a short-lived token for a browser page, minted with an API key.

A page's backend holds the key and asks for a token; the page passes the token as `?token=`
(EventSource and browser WebSockets cannot set headers). The token is bound to the key's name
(quotas count against it) and dies with the key.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway import openapi
from gateway.access.middleware import client_of
from gateway.errors import GatewayError
from gateway.routes.common import json_body, service_of

router = APIRouter()


@router.post("/v1/tokens", responses=openapi.TOKENS, openapi_extra=openapi.TOKENS_REQUEST)
async def mint_token(request: Request) -> JSONResponse:
    service = service_of(request)
    client = client_of(request.scope)
    if await request.body():
        await json_body(request)  # no fields yet, but the body must still be a JSON object
    keys = service.keys
    if keys is None:
        raise GatewayError(
            "this gateway has no API keys: its routes need no token",
            code="tokens_unavailable",
            status=400,
        )
    if client.via != "key":
        raise GatewayError(
            "mint tokens with an API key, not a token", code="key_required", status=403
        )
    ttl = service.settings.token_ttl_s
    token = keys.mint(client, service.wall_clock(), ttl)
    return JSONResponse({"token": token, "expires_in": ttl}, headers={"Cache-Control": "no-store"})
