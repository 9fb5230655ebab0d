"""`POST /v1/tokens`: a short-lived token for a browser page, minted with an API key.

A page's backend holds the key and asks for a token; the page passes the token as `?token=`
(EventSource and browser WebSockets cannot set headers). The token is bound to the key's name
(quotas count against it), to its `subject` (the page's visitor id, or a random one when the
body gives none: that visitor's sessions, replies and cancels are its own, within the key's
caps) and to the route groups the body names (`{"routes": ["speak"]}`; by default the speak
routes and the voice list), lives `--token-ttl-s` or the shorter `ttl_s` the body asks, and
dies with the key.
"""

from __future__ import annotations

import secrets

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway import openapi
from gateway.access.keys import DEFAULT_TOKEN_ROUTES, SUBJECT, TOKEN_ROUTES
from gateway.access.middleware import client_of
from gateway.errors import BadRequest, GatewayError
from gateway.routes.common import json_body, service_of

router = APIRouter()


@router.post("/v1/tokens", responses=openapi.TOKENS, openapi_extra=openapi.TOKENS_REQUEST)
async def mint_token(request: Request) -> JSONResponse:
    service = service_of(request)
    client = client_of(request.scope)
    body = await json_body(request) if await request.body() else {}
    keys = service.keys
    if keys is None:
        raise GatewayError(
            "this gateway has no API keys: its routes need no token",
            code="tokens_unavailable",
            status=400,
        )
    if unknown := set(body) - {"routes", "ttl_s", "subject"}:
        raise BadRequest(f"unknown fields: {sorted(unknown)}", code="invalid_field")
    routes = body.get("routes", list(DEFAULT_TOKEN_ROUTES))
    if (
        not isinstance(routes, list)
        or not routes
        or not all(isinstance(r, str) and r in TOKEN_ROUTES for r in routes)
    ):
        raise BadRequest(
            f"routes: a non-empty list of {sorted(TOKEN_ROUTES)}", code="invalid_field"
        )
    ttl = service.settings.token_ttl_s
    asked = body.get("ttl_s", ttl)
    if not isinstance(asked, int) or isinstance(asked, bool) or not 1 <= asked <= ttl:
        raise BadRequest(f"ttl_s: whole seconds, 1 to {ttl}", code="invalid_field")
    ttl = asked
    subject = body.get("subject")
    if subject is None:
        subject = secrets.token_hex(8)  # a visitor of its own
    elif not isinstance(subject, str) or not SUBJECT.fullmatch(subject):
        raise BadRequest(
            "subject: 1 to 64 characters of A-Z a-z 0-9 . _ : @ -", code="invalid_field"
        )
    token = keys.mint(client, service.wall_clock(), ttl, routes, subject)
    return JSONResponse(
        {"token": token, "expires_in": ttl, "routes": sorted(set(routes)), "subject": subject},
        headers={"Cache-Control": "no-store"},
    )
