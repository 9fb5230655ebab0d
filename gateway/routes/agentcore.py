"""The Bedrock AgentCore Runtime contract, on the gateway's port: what the reference agent's
users' clients speak.

- `POST /invocations` takes the reference agent's payload (`prompt` or `text`, `mode`, `voice`,
  `speed`, and this gateway's `format`) and answers `text/event-stream` with `data:`-only
  events, each JSON object carrying its `type` (`agent_start`, `text_delta`, `audio_chunk`
  with base64 `data`, `agent_end`, `error`, ...) beside the fields the SSE route gives.
- The runtime's session header (`X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`, 33-256
  characters) keys the conversation: a prompt is answered with that session's earlier turns.
- `GET /ping` answers `{"status": "Healthy"}`, or `"HealthyBusy"` while sessions are open
  (replies, WebSockets: the runtime then keeps the instance).
- `GET /ws` is the speak WebSocket (`/v1/speak/ws`'s protocol).

The access rules are the `/v1` routes' (`gateway.access.policy`): credentials, origins, bodies.
"""

from __future__ import annotations

import base64
from collections import OrderedDict

import orjson
from fastapi import APIRouter, Request, Response, WebSocket
from fastapi.responses import JSONResponse
from sse_starlette import ServerSentEvent

from gateway.errors import BadRequest
from gateway.params import SpeakParams, parse
from gateway.reply.events import AudioChunk, Event, payload
from gateway.routes import speak_ws
from gateway.routes.common import json_body, service_of
from gateway.routes.speak_sse import stream_reply

router = APIRouter()
SESSION_HEADER = "x-amzn-bedrock-agentcore-runtime-session-id"
SESSION_CHARS = (33, 256)
MAX_CONVERSATIONS = 1024  # sessions remembered, least recently used forgotten first
MAX_TURNS = 20  # turns kept per session (the newest)


class Conversations:
    """Each runtime session's turns, bounded in sessions and turns."""

    def __init__(self) -> None:
        self._turns: OrderedDict[str, list[dict[str, str]]] = OrderedDict()

    def history(self, session: str) -> list[dict[str, str]]:
        turns = self._turns.get(session, [])
        if session in self._turns:
            self._turns.move_to_end(session)
        return list(turns)

    def add(self, session: str, prompt: str, answer: str) -> None:
        turns = self._turns.setdefault(session, [])
        turns += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        del turns[:-MAX_TURNS]
        self._turns.move_to_end(session)
        while len(self._turns) > MAX_CONVERSATIONS:
            self._turns.popitem(last=False)


def data_event(event: Event, utterance_id: str, n: int) -> ServerSentEvent:
    """An event as the reference agent wrote it: `data:` only, its JSON naming its `type`."""
    body = {"type": event.name, **payload(event)}
    if isinstance(event, AudioChunk):
        body["data"] = base64.b64encode(event.data).decode()
    return ServerSentEvent(orjson.dumps(body).decode())


def _session(request: Request) -> str | None:
    session = request.headers.get(SESSION_HEADER)
    if session is not None and not SESSION_CHARS[0] <= len(session) <= SESSION_CHARS[1]:
        raise BadRequest(
            f"{SESSION_HEADER}: {SESSION_CHARS[0]} to {SESSION_CHARS[1]} characters",
            code="invalid_session_id",
        )
    return session


@router.post("/invocations", include_in_schema=False)
async def invocations(request: Request) -> Response:
    params = parse(SpeakParams, await json_body(request))
    session = _session(request)
    conversations: Conversations = request.app.state.conversations
    if session is None or params.prompt is None:
        return await stream_reply(request, params, data_event)
    prompt = params.prompt
    return await stream_reply(
        request,
        params,
        data_event,
        history=conversations.history(session),
        on_spoken=lambda answer: conversations.add(session, prompt, answer),
    )


@router.get("/ping", include_in_schema=False)
async def ping(request: Request) -> JSONResponse:
    busy = service_of(request).gate.sessions.total > 0
    return JSONResponse({"status": "HealthyBusy" if busy else "Healthy"})


@router.websocket("/ws")
async def ws(websocket: WebSocket) -> None:
    await speak_ws.speak_ws(websocket)
