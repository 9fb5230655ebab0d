"""Server-Sent Events: `GET /v1/speak/sse` (EventSource) and `POST /v1/speak` (fetch)."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from sse_starlette import EventSourceResponse, ServerSentEvent

from gateway.errors import BadRequest, GatewayError
from gateway.events import AudioChunk, Event, payload
from gateway.params import SpeakParams, parse
from gateway.routes.common import service_of

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
    transports = await service.admit()  # 503 overloaded before anything is streamed
    queue: asyncio.Queue[Event | None] = asyncio.Queue(service.settings.queue_size)
    reply = service.reply(params, source, queue, transports=transports)
    uid = reply.spec.utterance_id

    async def events() -> AsyncIterator[ServerSentEvent]:
        async with service.running(reply, "sse"):
            n = 0
            while (event := await queue.get()) is not None:
                yield sse_event(event, uid, n)
                n += 1

    headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Utterance-Id": uid}
    return EventSourceResponse(events(), headers=headers, ping=0)


@router.get("/v1/speak/sse")
async def speak_sse(request: Request) -> Response:
    query: dict[str, Any] = dict(request.query_params)
    return await _speak(request, parse(SpeakParams, query))


@router.post("/v1/speak")
async def speak_post(request: Request) -> Response:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise GatewayError(f"body is not JSON: {exc}", code="invalid_json", status=400) from exc
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object", code="not_an_object")
    return await _speak(request, parse(SpeakParams, body))
