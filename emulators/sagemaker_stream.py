"""SageMaker `InvokeEndpointWithResponseStream` over loopback, in the real wire format.

`POST /endpoints/{name}/invocations-response-stream` forwards the body to the model server's
`POST /invocations` (as SageMaker forwards to the container) and streams its answer back as an
AWS event stream of `PayloadPart` events, re-cut at arbitrary boundaries as the real service
does: a part boundary is not a message, frame or even sample boundary. Unknown endpoints get
the service's `ValidationError`. SigV4 headers are accepted, not verified.

Faults, as the service sends them (`StreamScript`):

- before the stream, an HTTP error with `x-amzn-ErrorType` and a JSON `{"Message"}` body for
  the first `fail_first` requests: `ThrottlingException` (400, the AWS common error),
  `ModelNotReadyException` (429), `InternalFailure` (500), `ServiceUnavailable` (503);
- mid-stream, an exception message in the event stream after some bytes of audio (0: before
  any): `ModelStreamError` (with its `ErrorCode`) or `InternalStreamFailure`, on every stream
  or on the first `stream_error_times` ones.

A container's answer that breaks off (the model server cuts a stream whose synthesis failed
after its headers) is a `ModelStreamError` too, as the service reports it.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from emulators.eventstream import encode_message, exception


@dataclass
class StreamScript:
    endpoint: str = "kokoro-tts"
    seed: int = 0
    max_part: int = 3000  # parts are 1..max_part bytes
    fail_first: int = 0  # refuse this many requests with `fail_status`/`fail_code` first
    fail_status: int = 400
    fail_code: str = "ThrottlingException"
    model_error_after: int | None = None  # bytes, then ModelStreamError (0: before any audio)
    model_error_code: str = "StreamBroken"  # its ErrorCode (or ModelInvocationTimeExceeded)
    internal_failure_after: int | None = None  # bytes, then InternalStreamFailure
    stream_error_times: int | None = None  # streams the two above break, the first (None: all)
    requests: list[bytes] = field(default_factory=list)  # every attempt, the refused included
    refused: int = 0  # requests answered with the injected HTTP error
    parts: list[int] = field(default_factory=list)  # sizes of the parts sent


def payload_part(data: bytes) -> bytes:
    headers = {
        ":message-type": "event",
        ":event-type": "PayloadPart",
        ":content-type": "application/octet-stream",
    }
    return encode_message(headers, data)


def http_error(status: int, code: str, message: str) -> Response:
    """An error before the stream, as the service answers it (restJson1)."""
    return Response(
        orjson.dumps({"Message": message}),
        status_code=status,
        media_type="application/json",
        headers={"x-amzn-ErrorType": f"{code}:http://internal.amazon.com/coral/"},
    )


def create_sagemaker_stream_emulator(
    model_server_url: str, script: StreamScript | None = None
) -> FastAPI:
    app = FastAPI()
    app.state.script = script or StreamScript()
    upstream = model_server_url.rstrip("/") + "/invocations"

    @app.post("/endpoints/{name}/invocations-response-stream")
    async def invoke(name: str, request: Request) -> Response:
        s: StreamScript = app.state.script
        if name != s.endpoint:
            return http_error(
                400, "ValidationError", f"Endpoint {name} of account 000000000000 not found."
            )
        payload = await request.body()
        s.requests.append(payload)
        if s.fail_first > 0:
            s.fail_first -= 1
            s.refused += 1
            return http_error(s.fail_status, s.fail_code, f"injected {s.fail_code}")
        rng = random.Random(s.seed + len(s.requests))
        model_error_after, internal_failure_after = s.model_error_after, s.internal_failure_after
        if s.stream_error_times is not None:
            if s.stream_error_times > 0:
                s.stream_error_times -= 1
            else:  # the scripted broken streams are over
                model_error_after = internal_failure_after = None

        def fault(upto: int) -> bytes | None:
            """The scripted exception message, once the audio sent would pass `upto` bytes."""
            for limit, kind in (
                (model_error_after, "ModelStreamError"),
                (internal_failure_after, "InternalStreamFailure"),
            ):
                if limit is not None and upto > limit:
                    extra = {"ErrorCode": s.model_error_code} if kind == "ModelStreamError" else {}
                    return exception(kind, f"injected {kind}", message_key="Message", **extra)
            return None

        async def parts(answer: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
            """The container's answer re-cut into PayloadParts of random sizes, until a fault."""
            sent, pending = 0, b""
            async for chunk in answer:
                pending += chunk
                while pending:
                    size = min(len(pending), rng.randint(1, s.max_part))
                    injected = fault(sent + size)
                    if injected is not None:
                        yield injected
                        return
                    part, pending = pending[:size], pending[size:]
                    s.parts.append(len(part))
                    sent += len(part)
                    yield payload_part(part)

        async def stream() -> AsyncIterator[bytes]:
            async with (
                httpx.AsyncClient(timeout=120) as client,
                client.stream(
                    "POST",
                    upstream,
                    content=payload,
                    headers={
                        "Content-Type": request.headers.get("content-type", "application/json")
                    },
                ) as r,
            ):
                if r.status_code != 200:
                    detail = (await r.aread()).decode(errors="replace")
                    yield exception(
                        "ModelStreamError",
                        f"container answered {r.status_code}: {detail}",
                        message_key="Message",
                        ErrorCode=str(r.status_code),
                    )
                    return
                try:
                    async for part in parts(r.aiter_raw()):
                        yield part
                except httpx.HTTPError as exc:  # the container's answer broke off
                    yield exception(
                        "ModelStreamError",
                        f"the model container's stream broke off: {type(exc).__name__}",
                        message_key="Message",
                        ErrorCode="StreamBroken",
                    )

        return StreamingResponse(
            stream(),
            media_type="application/vnd.amazon.eventstream",
            headers={"X-Amzn-SageMaker-Content-Type": "audio/pcm"},
        )

    return app
