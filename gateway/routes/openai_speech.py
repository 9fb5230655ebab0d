"""`POST /v1/audio/speech`, OpenAI-compatible: the `openai` SDK works against it unchanged."""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import AsyncIterator

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.responses import StreamingResponse

from gateway.encoders.base import FORMATS
from gateway.errors import GatewayError
from gateway.events import AgentEnd, AudioChunk, ErrorEvent, Event
from gateway.params import OpenAISpeechParams, SpeakParams, parse
from gateway.routes.common import service_of

log = logging.getLogger(__name__)
router = APIRouter()

# OpenAI's names for its formats -> ours (OpenAI's "opus" is Ogg, its "aac" is ADTS)
OPENAI_FORMATS = {
    "mp3": "mp3",
    "opus": "ogg",
    "aac": "adts",
    "flac": "flac",
    "wav": "wav",
    "pcm": "pcm",
}
OPENAI_VOICES = frozenset(
    {"alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage", "shimmer", "verse"}
)


@router.post("/v1/audio/speech")
async def speech(request: Request) -> Response:
    service = service_of(request)
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise GatewayError(f"body is not JSON: {exc}", code="invalid_json", status=400) from exc
    params = parse(OpenAISpeechParams, body)
    service.check_length(params.input, "input")
    # OpenAI's voice names speak with the default voice; any model-server voice by its name
    voice = None if params.voice in OPENAI_VOICES else params.voice
    speak = SpeakParams(
        text=params.input, mode="bidi", format="mp3", voice=voice, speed=params.speed
    )
    source = service.source_for(speak)
    assert source is not None
    fmt = OPENAI_FORMATS[params.response_format]
    queue: asyncio.Queue[Event | None] = asyncio.Queue(service.settings.queue_size)
    reply = service.reply(speak.model_copy(update={"format": fmt}), source, queue)

    if params.stream_format == "sse":

        async def sse() -> AsyncIterator[bytes]:
            async with service.running(reply, "openai"):
                while (event := await queue.get()) is not None:
                    if isinstance(event, AudioChunk):
                        delta = {
                            "type": "speech.audio.delta",
                            "audio": base64.b64encode(event.data).decode(),
                        }
                        yield b"data: " + orjson.dumps(delta) + b"\n\n"
                    elif isinstance(event, ErrorEvent):
                        error = {
                            "type": "error",
                            "error": {"code": event.code, "message": event.message},
                        }
                        yield b"data: " + orjson.dumps(error) + b"\n\n"
                    elif isinstance(event, AgentEnd):
                        done = {
                            "type": "speech.audio.done",
                            "usage": {
                                "input_tokens": len(params.input.split()),
                                "output_tokens": 0,
                                "total_tokens": len(params.input.split()),
                            },
                        }
                        yield b"data: " + orjson.dumps(done) + b"\n\n"

        return StreamingResponse(sse(), media_type="text/event-stream")

    async def audio() -> AsyncIterator[bytes]:
        async with service.running(reply, "openai"):
            while (event := await queue.get()) is not None:
                if isinstance(event, AudioChunk):
                    yield event.data
                elif isinstance(event, ErrorEvent):  # headers are sent: end the stream short
                    log.warning("speech %s ended early: %s", reply.spec.utterance_id, event)

    return StreamingResponse(audio(), media_type=FORMATS[fmt].mime)
