from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import HTTPConnection, Request

from gateway.errors import BadRequest
from gateway.service import GatewayService


def service_of(conn: HTTPConnection) -> GatewayService:
    service: GatewayService = conn.app.state.service
    return service


async def json_body(request: Request) -> dict[str, Any]:
    """The body as a JSON object (its type and size were checked by `access`)."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"body is not JSON: {exc}", code="invalid_json") from exc
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object", code="not_an_object")
    return body
