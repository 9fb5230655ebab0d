"""`WS /v1/twilio/ws?stream_sid=...`: a phone call's outbound voice in Twilio's Media Streams
messages. Credentials and the session caps are the speak WebSocket's, checked before the upgrade
is accepted (`speak_ws.serve_connection`); the connection is
`gateway.twilio.connection.TwilioConnection`."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from gateway.errors import BadRequest
from gateway.routes.speak_ws import Connect, serve_connection
from gateway.twilio.connection import TwilioConnection
from kokoro_contract import limits

router = APIRouter()


@router.websocket("/v1/twilio/ws")
async def twilio_ws(ws: WebSocket) -> None:
    def connection() -> Connect:
        sid = _stream_sid(ws.query_params.get("stream_sid"))
        return lambda service, client, lease: TwilioConnection(ws, service, client, lease, sid)

    await serve_connection(ws, connection)


def _stream_sid(value: str | None) -> str:
    """The Twilio stream the messages are for (its `streamSid`, e.g. `MZ` and 32 hex digits)."""
    if value is None:
        raise BadRequest("give '?stream_sid=' (the call's Twilio streamSid)", code="missing_field")
    return limits.check_utterance_id(value, "stream_sid")
