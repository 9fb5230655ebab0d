from __future__ import annotations

import re

from starlette.requests import HTTPConnection

from gateway.service import GatewayService

LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$")


def service_of(conn: HTTPConnection) -> GatewayService:
    service: GatewayService = conn.app.state.service
    return service


def origin_allowed(conn: HTTPConnection, allowed: list[str]) -> bool:
    """Browsers always send Origin on WebSockets; tools usually send none."""
    origin = conn.headers.get("origin")
    if origin is None:
        return True
    origin = origin.rstrip("/")
    if origin in allowed or LOCAL_ORIGIN.match(origin):
        return True
    host = conn.headers.get("host", "")
    return origin.split("://", 1)[-1] == host  # same origin
