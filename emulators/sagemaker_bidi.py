"""SageMaker's bidirectional stream (InvokeEndpointWithBidirectionalStream), in front of the
model server's WebSocket, as the service behaves:

- the caller's request body is an AWS event stream of SigV4 event-signed envelopes, each
  carrying one `PayloadPart` event (headers `DataType`, `CompletionState`); an empty envelope
  ends the input. Signatures are accepted, not verified;
- PARTIAL parts are joined until COMPLETE, and every client message reaches the container as a
  *binary* WebSocket frame unless the caller set `DataType=UTF8` (trap 1 for containers);
- every container frame comes back as one `PayloadPart` (`DataType` UTF8 for text frames,
  BINARY otherwise, `CompletionState` COMPLETE);
- a Close frame from the container while the caller's input is still open reaches the caller
  as a `ModelStreamError` exception event.

Faults, as the service sends them (`BidiScript`): the first `fail_first` streams refused at
open with an HTTP error (`x-amzn-errortype` and a JSON `{"Message"}` body): `ThrottlingException`
(400, the AWS common error), `ModelNotReadyException` (429), `InternalServerError` (500),
`ServiceUnavailableError` (503); and a `ModelStreamError` exception event mid-stream, in place
of the container's next frame once `model_error_after` audio parts have gone back (0: before the
first audio), on every stream or the first `stream_error_times` ones; the stream then ends and
the container's socket is closed.

`SeamTransport` plugs this into the HTTP/2 SDK through its transport seam (`send()` of a duplex
HTTP client): the SDK's own serialization, event signing and deserialization run for real; only
the HTTP/2 connection is replaced (see docs/testing.md for why).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from botocore.eventstream import EventStreamBuffer
from smithy_http import Field, Fields
from smithy_http.aio import HTTPResponse
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from emulators.eventstream import encode_message, exception

_PATH = re.compile(r"^/endpoints/(?P<name>[^/]+)/invocations-bidirectional-stream$")


@dataclass
class BidiScript:
    endpoint: str = "kokoro-tts"
    fail_first: int = 0  # refuse this many streams at open with `fail_status`/`fail_code`
    fail_status: int = 400
    fail_code: str = "ThrottlingException"
    model_error_after: int | None = None  # audio parts, then ModelStreamError (0: before any)
    model_error_code: str = "StreamBroken"  # its ErrorCode
    stream_error_times: int | None = None  # streams it breaks, the first ones (None: all)
    container_messages: list[tuple[str, bytes | str]] = field(default_factory=list)  # (kind, data)
    streams: int = 0  # streams bridged to the container
    refused: int = 0  # streams refused at open by `fail_first`
    parts: list[tuple[str, int]] = field(default_factory=list)  # (DataType, bytes) sent back


def response_part(data: bytes, data_type: str) -> bytes:
    headers = {
        ":message-type": "event",
        ":event-type": "PayloadPart",
        ":content-type": "application/octet-stream",
        "DataType": data_type,
        "CompletionState": "COMPLETE",
    }
    return encode_message(headers, data)


async def _payload_parts(body: AsyncIterable[bytes]) -> AsyncIterator[tuple[bytes, dict[str, Any]]]:
    """The PayloadPart events inside the signed envelopes; ends at the empty envelope."""
    envelopes = EventStreamBuffer()
    async for chunk in body:
        envelopes.add_data(chunk)
        for envelope in envelopes:
            if not envelope.payload:
                return
            inner = EventStreamBuffer()
            inner.add_data(envelope.payload)
            for message in inner:
                if message.headers.get(":event-type") == "PayloadPart":
                    yield message.payload, message.headers


async def _discard(body: AsyncIterable[bytes]) -> None:
    # the SDK's body provider yields b"" without suspending once it is closed: stop there,
    # or this loop would never give the event loop back
    async for chunk in body:
        if not chunk:
            return


class BidiBridge:
    def __init__(self, container_ws_url: str, script: BidiScript) -> None:
        self.url = container_ws_url
        self.script = script

    def _error_after(self) -> int | None:
        """This stream's `model_error_after`, counting it against `stream_error_times`."""
        s = self.script
        if s.stream_error_times is None:
            return s.model_error_after
        if s.stream_error_times > 0:
            s.stream_error_times -= 1
            return s.model_error_after
        return None  # the scripted broken streams are over

    async def run(self, body: AsyncIterable[bytes], out: asyncio.Queue[bytes | None]) -> None:
        self.script.streams += 1
        error_after = self._error_after()
        input_open = True
        broken = False
        try:
            async with connect(self.url, max_size=None) as ws:

                async def forward_input() -> None:
                    nonlocal input_open
                    message = b""
                    utf8 = False
                    async for payload, headers in _payload_parts(body):
                        message += payload
                        utf8 = headers.get("DataType") == "UTF8"
                        if headers.get("CompletionState", "COMPLETE") == "COMPLETE":
                            frame: bytes | str = message.decode() if utf8 else message
                            self.script.container_messages.append(
                                ("text" if utf8 else "binary", frame)
                            )
                            await ws.send(frame)
                            message = b""
                    input_open = False
                    await ws.close()  # the caller closed its input: close the container socket

                forward = asyncio.create_task(forward_input())
                audio_parts = 0
                try:
                    async for frame in ws:
                        if error_after is not None and audio_parts >= error_after:
                            broken = True  # the injected fault takes this frame's place
                            break
                        data_type = "UTF8" if isinstance(frame, str) else "BINARY"
                        data = frame.encode() if isinstance(frame, str) else frame
                        self.script.parts.append((data_type, len(data)))
                        await out.put(response_part(data, data_type))
                        if data_type == "BINARY":
                            audio_parts += 1
                except ConnectionClosed:
                    pass
                if broken:
                    await out.put(
                        exception(
                            "ModelStreamError",
                            "injected ModelStreamError",
                            message_key="Message",
                            ErrorCode=self.script.model_error_code,
                        )
                    )
                elif input_open:  # the container closed first
                    await out.put(
                        exception(
                            "ModelStreamError",
                            "Model closed the stream",
                            message_key="Message",
                            ErrorCode="ModelClosedStream",
                        )
                    )
                forward.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await forward
        finally:
            await out.put(None)
        if input_open:  # the stream is over: whatever the caller still sends is dropped
            await _discard(body)


class SeamTransport:
    """A duplex HTTP client for the SDK that hands each request to a `BidiBridge`."""

    SUPPORTS_DUPLEX_STREAMING = True

    def __init__(self, container_ws_url: str, script: BidiScript | None = None) -> None:
        self.script = script or BidiScript()
        self.bridge = BidiBridge(container_ws_url, self.script)
        self.requests: list[Any] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def send(self, request: Any, *, request_config: Any = None) -> HTTPResponse:
        self.requests.append(request)
        s = self.script
        match = _PATH.match(request.destination.path or "")
        if match is None or match["name"] != s.endpoint:
            name = match["name"] if match else request.destination.path
            message = f"Endpoint {name} of account 000000000000 not found."
            return self._refuse(request, 400, "ValidationError", message)
        if s.fail_first > 0:
            s.fail_first -= 1
            s.refused += 1
            return self._refuse(request, s.fail_status, s.fail_code, f"injected {s.fail_code}")
        out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._spawn(self.bridge.run(request.body, out))

        async def response_body() -> AsyncIterator[bytes]:
            while (data := await out.get()) is not None:
                yield data

        fields = Fields([Field(name="content-type", values=["application/vnd.amazon.eventstream"])])
        return HTTPResponse(status=200, fields=fields, body=response_body())

    def _refuse(self, request: Any, status: int, code: str, message: str) -> HTTPResponse:
        """An error before the stream, as the service answers it (restJson1)."""
        self._spawn(_discard(request.body))  # as a server resets the stream
        fields = Fields(
            [
                Field(name="x-amzn-errortype", values=[code]),
                Field(name="content-type", values=["application/json"]),
            ]
        )
        return HTTPResponse(status=status, fields=fields, body=orjson.dumps({"Message": message}))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
