"""GET /ping, GET /voices, GET /load, GET /metrics, POST /invocations."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kokoro_contract import formats
from kokoro_contract.audio import SAMPLE_RATE, pcm_duration_s, wav_header
from kokoro_contract.cut_stream import CutStreamingResponse, StreamCut
from kokoro_contract.errors import InvalidRequest, ServiceError
from kokoro_contract.openapi import JSON
from kokoro_contract.protocol import (
    ProtocolError,
    RequestRules,
    SynthesisRequest,
    WordTimingsMsg,
    decode_frame,
    validate_synthesis,
)
from model_server import openapi
from model_server.service import ModelService
from model_server.synthesis import SegmentAudio

log = logging.getLogger(__name__)
router = APIRouter()


def _service(request: Request) -> ModelService:
    service: ModelService = request.app.state.service
    return service


async def _unless_client_leaves[T](request: Request, work: Coroutine[Any, Any, T]) -> T | None:
    """`work`'s result, or None when the client disconnects first: then `work` is cancelled
    (the scheduler gives up its turns, the running engine call is told to stop). Once the
    body is read, the server's `receive` answers only when the client has gone."""

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    job, watch = asyncio.ensure_future(work), asyncio.ensure_future(gone())
    try:
        await asyncio.wait((job, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (job, watch):
            task.cancel()
        await asyncio.gather(job, watch, return_exceptions=True)
    return None if job.cancelled() else job.result()


def _stuck(service: ModelService) -> str | None:
    """Why the watchdog says this server is wedged, or None: an engine call has run longer
    than `--watchdog-s` (a hung driver, a deadlocked thread), so SageMaker or Kubernetes
    replaces the container instead of routing to it forever."""
    limit = service.settings.watchdog_s
    if not limit or not service.ready:
        return None
    running = service.get().synthesizer.scheduler.longest_call_s()
    if running <= limit:
        return None
    return f"an engine call has run for {running:.0f} s (watchdog {limit:.0f} s)"


@router.get("/ping", response_class=JSONResponse, responses=openapi.PING)
async def ping(request: Request) -> JSONResponse:
    service = _service(request)
    inflight = request.app.state.inflight.count  # requests and sessions running: for draining
    stuck = _stuck(service)
    if stuck is not None:
        return JSONResponse({"status": "stuck", "detail": stuck, "inflight": inflight}, 503)
    if service.ready:
        loaded = service.get()
        engine = loaded.synthesizer.engine.description
        body = {"status": "ok", "inflight": inflight, "engine": engine}
        return JSONResponse({**body, "voice": loaded.rules.default_voice})
    status = "failed" if service.failure else "loading"
    body = {"status": status, "detail": service.failure or "model loading", "inflight": inflight}
    return JSONResponse(body, status_code=503)


@router.get("/load", response_class=JSONResponse, responses=openapi.LOAD)
async def load(request: Request) -> Response:
    """How far behind the engine is, for the gateway's admission control and routing: a light
    answer, computed from the scheduler's state (`/ping` stays the SageMaker contract), in the
    JSON both services read (`kokoro_contract.load`)."""
    service = _service(request)
    stuck = _stuck(service)
    if stuck is not None:
        raise ServiceError(stuck, code="stuck", status=503, retryable=True)
    report = service.get().synthesizer.scheduler.load()
    report = dataclasses.replace(report, inflight=request.app.state.inflight.count)
    return Response(report.encode(), media_type=JSON)


@router.get("/metrics", response_class=Response, responses=openapi.METRICS)
async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics), media_type=CONTENT_TYPE_LATEST)


@router.get("/voices", response_class=JSONResponse, responses=openapi.VOICES)
async def voices(request: Request) -> JSONResponse:
    loaded = _service(request).get()
    engine_voices = loaded.synthesizer.engine.voices()
    return JSONResponse(
        {
            "default": loaded.rules.default_voice,
            "voices": [{"name": n, "source": s} for n, s in sorted(engine_voices.items())],
        }
    )


async def _json_object(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object, or 400 with the protocol's code (`invalid_json`,
    `not_an_object`, `invalid_utf8`)."""
    obj = decode_frame(await request.body())
    if isinstance(obj, ProtocolError):
        raise InvalidRequest(obj.message, code=obj.code)
    return obj


def _synthesis(obj: dict[str, Any], rules: RequestRules) -> SynthesisRequest:
    """A route body checked as a synthesis request (`validate_synthesis`), or 400 with its
    code."""
    synth = validate_synthesis(obj, rules)
    if isinstance(synth, ProtocolError):
        raise InvalidRequest(synth.message, code=synth.code)
    return synth


@router.post(
    "/phonemize",
    response_class=JSONResponse,
    responses=openapi.PHONEMIZE,
    openapi_extra=openapi.PHONEMIZE_REQUEST,
)
async def phonemize(request: Request) -> JSONResponse:
    """What the G2P makes of a text, nothing voiced: to check how a name or a language is
    read before speaking it (its body checked as a synthesis request's: `text`, `language`,
    `voice`, `normalize`, `markup`, `lexicon`)."""
    loaded = _service(request).get()
    asked = _synthesis(await _json_object(request), loaded.rules)
    reading, phonemes, segments = await loaded.synthesizer.phonemize(
        asked.text, asked.language, asked.voice, asked.normalize, asked.markup, asked.lexicon
    )
    return JSONResponse(
        {
            "language": reading.language.name,
            "voice": asked.voice,
            "g2p": reading.g2p.name,
            "phonemes": phonemes,
            "segments": list(segments),
        }
    )


@router.post(
    "/invocations",
    response_class=Response,
    responses=openapi.INVOCATIONS,
    openapi_extra=openapi.INVOCATION_REQUEST,
)
async def invocations(request: Request) -> Response:
    loaded = _service(request).get()
    obj = await _json_object(request)
    synth = _synthesis(obj, loaded.rules)
    try:
        fmt = formats.lookup(obj.get("format", "pcm"), formats.MODEL_SERVER_FORMATS)
    except formats.UnknownFormat as exc:
        raise InvalidRequest(str(exc), code="unsupported_format") from exc
    stream = obj.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest("field 'stream' must be true or false", code="invalid_field")
    if stream and synth.timestamps:
        raise InvalidRequest(
            "timestamps need stream false: word timings come in one JSON answer beside the audio",
            code="invalid_field",
        )
    key = object()  # every HTTP request takes its own turns in the scheduler
    received = time.perf_counter()
    plan = await loaded.synthesizer.plan(synth)  # text it cannot read: 422, not a cut stream
    headers = {"X-Request-Id": synth.request_id}

    if stream:

        async def body() -> AsyncIterator[bytes]:
            if fmt.name == "wav":
                yield wav_header(None)
            try:
                async for pcm in loaded.synthesizer.stream(synth, key, received, plan):
                    yield pcm
            except ServiceError as exc:  # headers are gone: cut the stream, log why
                log.warning("request %s cut short: %s", synth.request_id, exc.message)
                raise StreamCut from exc

        return CutStreamingResponse(body(), media_type=fmt.mime, headers=headers)

    limit = _service(request).settings.invocation_timeout_s
    estimate = sum(loaded.synthesizer.scheduler.speed.estimate(len(s)) for s in plan.segments)
    if limit and estimate > limit:
        raise ServiceError(
            f"this text would take about {estimate:.0f} s to synthesize, past the {limit:.0f} s "
            'an invocation may take: send it with "stream": true (audio as it is made), or '
            "over the bidirectional stream",
            code="synthesis_too_long",
            status=413,
        )

    async def collect() -> list[SegmentAudio]:
        return [c async for c in loaded.synthesizer.stream_timed(synth, key, received, plan)]

    started = time.perf_counter()
    chunks = await _unless_client_leaves(request, collect())
    if chunks is None:  # nobody to answer; the synthesis stopped at its next step
        log.info("request %s: the client went away", synth.request_id)
        return Response(status_code=499)
    pcm = b"".join(c.pcm for c in chunks)
    elapsed = time.perf_counter() - started
    headers["X-Audio-Duration-S"] = f"{pcm_duration_s(len(pcm)):.4f}"
    headers["X-Inference-Time-S"] = f"{elapsed:.4f}"
    content = wav_header(len(pcm)) + pcm if fmt.name == "wav" else pcm
    if not synth.timestamps:
        return Response(content, media_type=fmt.mime, headers=headers)
    # captioned speech: the audio as base64 beside its words (the same word objects as the
    # WebSocket's word_timings frames), as one JSON answer
    words = [w for c in chunks for w in c.words or ()]
    answer = {
        "audio": base64.b64encode(content).decode(),
        "format": fmt.name,
        "sample_rate": SAMPLE_RATE,
        "words": orjson.loads(WordTimingsMsg(synth.request_id, tuple(words)).encode())["words"],
    }
    return Response(orjson.dumps(answer), media_type=JSON, headers=headers)
