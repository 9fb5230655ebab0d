"""`POST /v1/audio/speech`, OpenAI-compatible: the `openai` SDK works against it unchanged."""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from sse_starlette import ServerSentEvent

from gateway import openapi
from gateway.access.middleware import client_of
from gateway.params import Mode, OpenAISpeechParams, SpeakParams, parse
from gateway.reply.events import AgentEnd, AudioChunk, ErrorEvent
from gateway.routes.common import json_body, service_of
from gateway.routes.responses import ReplyEventSource, TimedStreamingResponse
from gateway.service.speak import speak
from kokoro_contract.cut_stream import StreamCut

log = logging.getLogger(__name__)
router = APIRouter()


def _sse(body: dict[str, Any]) -> ServerSentEvent:
    return ServerSentEvent(orjson.dumps(body).decode())


@router.post("/v1/audio/speech", responses=openapi.SPEECH, openapi_extra=openapi.SPEECH_REQUEST)
async def speech(request: Request) -> Response:
    service = service_of(request)
    params = parse(OpenAISpeechParams, await json_body(request))
    # OpenAI's voice names through the voice table, the model servers' own by name (`speak`)
    asked = SpeakParams(
        text=params.input,
        mode=Mode.BIDI,
        voice=params.voice,
        speed=params.speed,
        language=params.language,
        normalize=params.normalize,
        markup=params.markup,
        lexicon=params.lexicon,
    )
    fmt = params.audio_format
    timeout = service.settings.send_timeout_s
    async with contextlib.AsyncExitStack() as stack:
        # 400 / 503 overloaded / 429 before anything is streamed, holding nothing; the
        # response holds the reply from here and ends it as it ends (`closing`)
        reply = await stack.enter_async_context(
            speak(service, client_of(request.scope), asked, transport="openai", audio_format=fmt)
        )

        if params.stream_format == "sse":
            words = len(params.input.split())

            async def sse() -> AsyncIterator[ServerSentEvent]:
                async for event in reply:
                    if isinstance(event, AudioChunk):
                        audio = base64.b64encode(event.data).decode()
                        yield _sse({"type": "speech.audio.delta", "audio": audio})
                    elif isinstance(event, ErrorEvent):
                        error = {"code": event.code, "message": event.message}
                        yield _sse({"type": "error", "error": error})
                    elif isinstance(event, AgentEnd):
                        usage = {"input_tokens": words, "output_tokens": 0, "total_tokens": words}
                        yield _sse({"type": "speech.audio.done", "usage": usage})

            return ReplyEventSource(sse(), ping=0, send_timeout=timeout, closing=stack.pop_all())

        async def audio() -> AsyncIterator[bytes]:
            failed: ErrorEvent | None = None
            async for event in reply:  # (the reply ends as it does)
                if isinstance(event, AudioChunk):
                    yield event.data
                elif isinstance(event, ErrorEvent):
                    failed = event
            if failed is not None:  # headers are sent: cut the stream, never end it as whole
                log.warning(
                    "speech %s cut short: %s (%s)", reply.utterance_id, failed.code, failed.message
                )
                raise StreamCut

        return TimedStreamingResponse(
            audio(), media_type=fmt.mime, send_timeout=timeout, closing=stack.pop_all()
        )
