"""Server-Sent Events: `GET /v1/speak/sse` (EventSource) and `POST /v1/speak` (fetch), and
their barge-in, `POST /v1/speak/{utterance_id}/cancel`."""

from __future__ import annotations

import asyncio
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
from gateway.aio import cancel_and_wait
from gateway.errors import BadRequest, GatewayError
from gateway.params import CancelParams, SpeakParams, parse
from gateway.reply.events import AudioChunk, Cancelled, Event, TextDelta, payload
from gateway.routes.common import json_body, service_of
from gateway.routes.responses import ReplyEventSource
from gateway.service.gate import LiveReply
from gateway.speak_ws.session import new_utterance_id

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
    """A reply as Server-Sent Events, each written by `event_format`; `history`: the
    conversation before it, for a prompt; `on_spoken(text)`: the text it spoke, once it has
    ended (a conversation keeps it)."""
    service = service_of(request)
    if request.headers.get("last-event-id"):
        # EventSource reconnects even after a clean end; a reply is never replayed
        return Response(status_code=204)
    source = service.replies.source_for(params, history)
    if source is None:
        raise BadRequest("give 'text' or 'prompt'", code="missing_text")
    # a voice no model server has: 400 before anything is streamed
    params = params.model_copy(update={"voice": await service.replies.voices.resolve(params.voice)})
    uid = params.utterance_id or new_utterance_id()
    prompt = params.prompt is not None
    async with contextlib.AsyncExitStack() as stack:
        # 503 overloaded / 429 / 400 busy before anything is streamed, holding nothing
        admitted = await stack.enter_async_context(
            service.gate.start(client_of(request.scope), prompt=prompt, cancellable=uid)
        )
        queue: asyncio.Queue[Event | None] = asyncio.Queue(service.settings.queue_size)
        reply = service.replies.build(params, source, queue, admitted, utterance_id=uid)
        live = admitted.live
        assert live is not None

        async def events() -> AsyncIterator[ServerSentEvent]:
            spoken: list[str] = []
            async with service.replies.running(reply, "sse") as task:
                n = 0
                while (event := await next_event(queue, live)) is not None:
                    if isinstance(event, TextDelta):
                        spoken.append(event.text)
                    yield event_format(event, uid, n)
                    n += 1
                if live.cancel.done():  # a barge-in: stop, then say what was heard
                    await cancel_and_wait(task)
                    played = live.cancel.result()
                    heard = None if played is None else reply.heard(played)
                    live.heard.set_result(heard)
                    service.metrics.cancels.inc()
                    yield event_format(Cancelled(uid, played, heard), uid, n)
            if on_spoken is not None:
                on_spoken("".join(spoken))

        headers = {"Cache-Control": "no-store", "X-Accel-Buffering": "no", "X-Utterance-Id": uid}
        timeout = service.settings.send_timeout_s
        return ReplyEventSource(
            events(), headers=headers, ping=0, send_timeout=timeout, closing=stack.pop_all()
        )


async def next_event(queue: asyncio.Queue[Event | None], live: LiveReply) -> Event | None:
    """The reply's next event; None at its end, or once a cancel has come for it."""
    if live.cancel.done():
        return None
    getting = asyncio.ensure_future(queue.get())
    try:
        waits: set[asyncio.Future[Any]] = {getting, live.cancel}
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not getting.done():
            getting.cancel()
    if getting.cancelled() or not getting.done():
        return None
    return getting.result()


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
    # only the key and token subject that started it (or the key itself) may stop it
    live = service.gate.live_reply(client_of(request.scope), utterance_id)
    if live is None:
        raise GatewayError(
            f"no reply {utterance_id!r} of yours is playing", code="unknown_utterance", status=404
        )
    if not live.cancel.done():
        live.cancel.set_result(played)
    try:
        heard = await asyncio.wait_for(asyncio.shield(live.heard), timeout=10)
    except TimeoutError:  # the reply could not stop in time: it is stopping all the same
        heard = None
    return JSONResponse({"utterance_id": utterance_id, "played_ms": played, "heard_text": heard})


@router.get("/v1/speak/sse", responses=openapi.SPEAK, openapi_extra=openapi.SPEAK_QUERY)
async def speak_sse(request: Request) -> Response:
    query: dict[str, Any] = dict(request.query_params)
    query.pop("token", None)  # credentials, checked by `access`
    return await stream_reply(request, parse(SpeakParams, query))


@router.post("/v1/speak", responses=openapi.SPEAK_POST, openapi_extra=openapi.SPEAK_REQUEST)
async def speak_post(request: Request) -> Response:
    return await stream_reply(request, parse(SpeakParams, await json_body(request)))
