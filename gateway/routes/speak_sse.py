"""Server-Sent Events: `GET /v1/speak/sse` (EventSource) and `POST /v1/speak` (fetch), and
their barge-in, `POST /v1/speak/{utterance_id}/cancel`."""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse
from sse_starlette import ServerSentEvent

from gateway import openapi
from gateway.access.middleware import client_of
from gateway.errors import GatewayError
from gateway.params import CancelParams, SpeakParams, parse
from gateway.reply.events import AudioChunk, Event, TextDelta, payload
from gateway.routes.common import json_body, service_of
from gateway.routes.responses import ReplyEventSource
from gateway.service.speak import speak

router = APIRouter()


def sse_event(event: Event, utterance_id: str, n: int) -> ServerSentEvent:
    body = payload(event)
    if isinstance(event, AudioChunk):
        body["data"] = base64.b64encode(event.data).decode()
    return ServerSentEvent(orjson.dumps(body).decode(), event=event.name, id=f"{utterance_id}:{n}")


EventFormat = Callable[[Event, str, int], ServerSentEvent]


async def stream_reply(
    request: Request,
    params: SpeakParams,
    event_format: EventFormat = sse_event,
    history: Sequence[dict[str, str]] = (),
    on_spoken: Callable[[str], None] | None = None,
) -> Response:
    """A reply (`gateway.service.speak`) as Server-Sent Events, each written by
    `event_format`; `history`: the conversation before it, for a prompt; `on_spoken(text)`:
    the text it spoke, once it has ended (a conversation keeps it)."""
    service = service_of(request)
    if request.headers.get("last-event-id"):
        # EventSource reconnects even after a clean end; a reply is never replayed
        return Response(status_code=204)
    async with contextlib.AsyncExitStack() as stack:
        # 400 / 503 overloaded / 429 / 400 busy before anything is streamed, holding nothing;
        # the response holds the reply from here and ends it as it ends (`closing`)
        speech = await stack.enter_async_context(
            speak(
                service,
                client_of(request.scope),
                params,
                transport="sse",
                history=history,
                cancellable=True,
            )
        )
        uid = speech.utterance_id

        async def events() -> AsyncIterator[ServerSentEvent]:
            spoken: list[str] = []
            n = 0
            async for event in speech:
                if isinstance(event, TextDelta):
                    spoken.append(event.text)
                yield event_format(event, uid, n)
                n += 1
            if on_spoken is not None:
                on_spoken("".join(spoken))

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Utterance-Id": uid}
        timeout = service.settings.send_timeout_s
        return ReplyEventSource(
            events(), headers=headers, ping=0, send_timeout=timeout, closing=stack.pop_all()
        )


@router.post(
    "/v1/speak/{utterance_id}/cancel",
    responses=openapi.CANCEL,
    openapi_extra=openapi.CANCEL_REQUEST,
)
async def cancel(utterance_id: str, request: Request) -> JSONResponse:
    """Barge-in for an SSE reply (EventSource cannot send anything back): `{"played_ms"}` says
    how much the listener heard; the answer, and the stream's last event, say what that was."""
    service = service_of(request)
    body = await json_body(request) if await request.body() else {}
    played = parse(CancelParams, body).played_ms
    # only the key and token subject that started it (or the key itself) may stop it, on
    # whichever gateway of the fleet holds it
    stopped = await service.gate.cancel(client_of(request.scope), utterance_id, played)
    if stopped is None:
        raise GatewayError(
            f"no reply {utterance_id!r} of yours is playing", code="unknown_utterance", status=404
        )
    return JSONResponse(
        {"utterance_id": utterance_id, "played_ms": played, "heard_text": stopped.heard_text}
    )


@router.get("/v1/speak/sse", responses=openapi.SPEAK, openapi_extra=openapi.SPEAK_QUERY)
async def speak_sse(request: Request) -> Response:
    query: dict[str, Any] = dict(request.query_params)
    query.pop("token", None)  # credentials, checked by `access`
    return await stream_reply(request, parse(SpeakParams, query))


@router.post("/v1/speak", responses=openapi.SPEAK_POST, openapi_extra=openapi.SPEAK_REQUEST)
async def speak_post(request: Request) -> Response:
    return await stream_reply(request, parse(SpeakParams, await json_body(request)))
