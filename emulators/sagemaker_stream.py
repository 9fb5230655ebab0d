"""SageMaker `InvokeEndpointWithResponseStream` over loopback, in the real wire format.

`POST /endpoints/{name}/invocations-response-stream` forwards the body to the model server's
`POST /invocations` (as SageMaker forwards to the container) and streams its answer back as an
AWS event stream of `PayloadPart` events, re-cut at arbitrary boundaries as the real service
does: a part boundary is not a message, frame or even sample boundary. Error injection:
`ModelStreamError` after some bytes, or `InternalStreamFailure`. Unknown endpoints get the
service's `ValidationError`. SigV4 headers are accepted, not verified.
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
    model_error_after: int | None = None  # bytes, then ModelStreamError
    internal_failure_after: int | None = None  # bytes, then InternalStreamFailure
    requests: list[bytes] = field(default_factory=list)
    parts: list[int] = field(default_factory=list)  # sizes of the parts sent


def payload_part(data: bytes) -> bytes:
    headers = {
        ":message-type": "event",
        ":event-type": "PayloadPart",
        ":content-type": "application/octet-stream",
    }
    return encode_message(headers, data)


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
            body = orjson.dumps({"message": f"Endpoint {name} of account 000000000000 not found."})
            return Response(
                body,
                status_code=400,
                media_type="application/json",
                headers={"x-amzn-ErrorType": "ValidationError:http://internal.amazon.com/coral/"},
            )
        payload = await request.body()
        s.requests.append(payload)
        rng = random.Random(s.seed + len(s.requests))

        async def stream() -> AsyncIterator[bytes]:
            sent = 0
            pending = b""
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
                        ErrorCode=str(r.status_code),
                    )
                    return
                async for chunk in r.aiter_raw():
                    pending += chunk
                    while pending:
                        size = min(len(pending), rng.randint(1, s.max_part))
                        for limit, kind in (
                            (s.model_error_after, "ModelStreamError"),
                            (s.internal_failure_after, "InternalStreamFailure"),
                        ):
                            if limit is not None and sent + size > limit:
                                extra = (
                                    {"ErrorCode": "ModelError"}
                                    if kind == "ModelStreamError"
                                    else {}
                                )
                                yield exception(kind, f"injected {kind}", **extra)
                                return
                        part, pending = pending[:size], pending[size:]
                        s.parts.append(len(part))
                        sent += len(part)
                        yield payload_part(part)

        return StreamingResponse(
            stream(),
            media_type="application/vnd.amazon.eventstream",
            headers={"X-Amzn-SageMaker-Content-Type": "audio/pcm"},
        )

    return app
