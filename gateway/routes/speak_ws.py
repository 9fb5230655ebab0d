"""`WS /v1/speak/ws`: the session caps are checked before the upgrade is accepted; the
connection itself is `gateway.speak_ws.connection.SpeakConnection`."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse

from gateway.access.middleware import client_of
from gateway.routes.common import service_of
from gateway.speak_ws.connection import SpeakConnection
from kokoro_contract.errors import ServiceError, error_body
from kokoro_contract.ws_sender import ClientGone

router = APIRouter()


@router.websocket("/v1/speak/ws")
async def speak_ws(ws: WebSocket) -> None:
    """Origin and credentials were checked before this runs (`access`); the session caps are
    checked here, still before the upgrade is accepted."""
    service = service_of(ws)
    client = client_of(ws.scope)
    try:
        lease = service.gate.open_session(client)
    except ServiceError as exc:
        service.metrics.errors.labels(exc.code).inc()
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        body = error_body(exc.code, exc.message, exc.retryable)
        await ws.send_denial_response(JSONResponse(body, exc.status, headers=headers))
        return
    try:
        await ws.accept()
        with contextlib.suppress(ClientGone):
            await SpeakConnection(ws, service, client, lease).run()
    finally:
        lease.release()
