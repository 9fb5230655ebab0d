"""`WS /v1/speak/ws`: the protocol asked for (`?protocol=2`: several contexts) and the session
caps are checked before the upgrade is accepted; the connection itself is
`gateway.speak_ws.connection.SpeakConnection`. `serve_connection` does the same for every
WebSocket on the speak rules (the Twilio stream's too)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse

from gateway.access.keys import Client
from gateway.access.middleware import client_of
from gateway.access.quotas import Lease
from gateway.errors import BadRequest
from gateway.routes.common import service_of
from gateway.service import GatewayService
from gateway.speak_ws.connection import SpeakConnection
from gateway.speak_ws.protocol import VERSIONS
from kokoro_contract.errors import ServiceError, error_body
from kokoro_contract.ws_sender import ClientGone

router = APIRouter()

Connect = Callable[[GatewayService, Client, Lease], SpeakConnection]


@router.websocket("/v1/speak/ws")
async def speak_ws(ws: WebSocket) -> None:
    """Origin and credentials were checked before this runs (`access`)."""

    def connection() -> Connect:
        version = _version(ws.query_params.get("protocol"))
        return lambda service, client, lease: SpeakConnection(ws, service, client, lease, version)

    await serve_connection(ws, connection)


async def serve_connection(ws: WebSocket, connection: Callable[[], Connect]) -> None:
    """Before the upgrade is accepted: what the query asks for (`connection` raises a
    `ServiceError` for what it refuses) and the session caps; refused, an HTTP status and a
    JSON error body. Then the connection runs in the session, given back at its end."""
    service = service_of(ws)
    client = client_of(ws.scope)
    try:
        connect = connection()
        lease = await service.gate.open_session(client)
    except ServiceError as exc:
        service.metrics.errors.labels(exc.code).inc()
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        body = error_body(exc.code, exc.message, exc.retryable)
        await ws.send_denial_response(JSONResponse(body, exc.status, headers=headers))
        return
    try:
        await ws.accept()
        with contextlib.suppress(ClientGone):
            await connect(service, client, lease).run()
    finally:
        lease.release()


def _version(asked: str | None) -> int:
    """The protocol asked for: 1 without `protocol`, else one of `VERSIONS`."""
    if asked is None:
        return 1
    if asked not in {str(v) for v in VERSIONS}:
        names = " or ".join(str(v) for v in VERSIONS)
        raise BadRequest(f"'protocol' is {names}", code="invalid_protocol")
    return int(asked)
