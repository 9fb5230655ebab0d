"""The Bedrock AgentCore Runtime contract, on the gateway's port: what the reference agent's
users' clients speak.

- `POST /invocations` takes the reference agent's payload (`prompt` or `text`, `mode`, `voice`,
  `speed`, and this gateway's `format`) and answers `text/event-stream` with `data:`-only
  events, each JSON object carrying its `type` (`agent_start`, `text_delta`, `audio_chunk`
  with base64 `data`, `agent_end`, `error`, ...) beside the fields the SSE route gives: the
  SSE route's adapter (`stream_reply`, over `gateway.service.speak`) with this wire's events.
- The runtime's session header (`X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`, 33-256
  characters) and the caller (its API key's name and a token's subject, or its address when
  anonymous: `Client.holder`) key the conversation: a prompt is answered with that caller's
  earlier turns in that session, never another caller's under the same header. A
  conversation keeps at most `--max-history-chars` characters (the oldest exchanges go first,
  as on the WebSocket); the gateway keeps at most `MAX_CONVERSATIONS`, the least recently
  used forgotten first.
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

from gateway.access.middleware import client_of
from gateway.errors import BadRequest
from gateway.params import SpeakParams, parse
from gateway.reply.events import AudioChunk, Event, payload
from gateway.routes import speak_ws
from gateway.routes.common import json_body, service_of
from gateway.routes.speak_sse import stream_reply
from gateway.speak_ws.session import Turn, trim_history

router = APIRouter()
SESSION_HEADER = "x-amzn-bedrock-agentcore-runtime-session-id"
SESSION_CHARS = (33, 256)
MAX_CONVERSATIONS = 1024  # sessions remembered, least recently used forgotten first
MAX_TURNS = 20  # turns kept per session (the newest)


ConversationKey = tuple[str, str]  # (the caller, the runtime session)


class Conversations:
    """Each caller's runtime sessions' turns, bounded in sessions, turns and characters."""

    def __init__(self) -> None:
        self._turns: OrderedDict[ConversationKey, list[Turn]] = OrderedDict()

    def history(self, key: ConversationKey) -> list[Turn]:
        turns = self._turns.get(key, [])
        if key in self._turns:
            self._turns.move_to_end(key)
        return list(turns)

    def add(self, key: ConversationKey, prompt: str, answer: str, max_chars: int) -> None:
        """Keep an exchange; the oldest go past `MAX_TURNS` turns or `max_chars` characters."""
        turns = self._turns.setdefault(key, [])
        turns += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]
        del turns[:-MAX_TURNS]
        trim_history(turns, max_chars)
        self._turns.move_to_end(key)
        while len(self._turns) > MAX_CONVERSATIONS:
            self._turns.popitem(last=False)

    def __len__(self) -> int:
        return len(self._turns)


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
    key = (client_of(request.scope).holder, session)  # another caller's session is not yours
    max_chars = service_of(request).settings.max_history_chars
    return await stream_reply(
        request,
        params,
        data_event,
        history=conversations.history(key),
        on_spoken=lambda answer: conversations.add(key, prompt, answer, max_chars),
    )


@router.get("/ping", include_in_schema=False)
async def ping(request: Request) -> JSONResponse:
    busy = service_of(request).gate.sessions.total > 0
    return JSONResponse({"status": "HealthyBusy" if busy else "Healthy"})


@router.websocket("/ws")
async def ws(websocket: WebSocket) -> None:
    await speak_ws.speak_ws(websocket)
