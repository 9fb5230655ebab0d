"""Server-Sent Events: `GET /v1/speak/sse` (EventSource) and `POST /v1/speak` (fetch)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from sse_starlette import ServerSentEvent

from gateway import openapi
from gateway.access_middleware import client_of
from gateway.errors import BadRequest
from gateway.events import AudioChunk, Event, payload
from gateway.params import SpeakParams, parse
from gateway.routes.common import json_body, service_of
from gateway.routes.responses import ReplyEventSource

router = APIRouter()


def sse_event(event: Event, utterance_id: str, n: int) -> ServerSentEvent:
    body = payload(event)
    if isinstance(event, AudioChunk):
        body["data"] = base64.b64encode(event.data).decode()
    return ServerSentEvent(orjson.dumps(body).decode(), event=event.name, id=f"{utterance_id}:{n}")


async def _speak(request: Request, params: SpeakParams) -> Response:
    service = service_of(request)
    if request.headers.get("last-event-id"):
        # EventSource reconnects even after a clean end; a reply is never replayed
        return Response(status_code=204)
    source = service.source_for(params)
    if source is None:
        raise BadRequest("give 'text' or 'prompt'", code="missing_text")
    client = client_of(request.scope)
    lease = service.open_session(client)  # 503 overloaded / 429 before anything is streamed
    try:
        transports = await service.admit(client, params.prompt is not None)
    except BaseException:
        lease.release()
        raise
    queue: asyncio.Queue[Event | None] = asyncio.Queue(service.settings.queue_size)
    reply = service.reply(params, source, queue, transports=transports, client=client, lease=lease)
    uid = reply.spec.utterance_id

    async def events() -> AsyncIterator[ServerSentEvent]:
        async with service.running(reply, "sse"):
            n = 0
            while (event := await queue.get()) is not None:
                yield sse_event(event, uid, n)
                n += 1

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Utterance-Id": uid}
    timeout = service.settings.send_timeout_s
    return ReplyEventSource(events(), headers=headers, ping=0, send_timeout=timeout)


@router.get("/v1/speak/sse", responses=openapi.SPEAK, openapi_extra=openapi.SPEAK_QUERY)
async def speak_sse(request: Request) -> Response:
    query: dict[str, Any] = dict(request.query_params)
    query.pop("token", None)  # credentials, checked by `access`
    return await _speak(request, parse(SpeakParams, query))


@router.post("/v1/speak", responses=openapi.SPEAK_POST, openapi_extra=openapi.SPEAK_REQUEST)
async def speak_post(request: Request) -> Response:
    return await _speak(request, parse(SpeakParams, await json_body(request)))
