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
    container_messages: list[tuple[str, bytes | str]] = field(default_factory=list)  # (kind, data)
    streams: int = 0


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

    async def run(self, body: AsyncIterable[bytes], out: asyncio.Queue[bytes | None]) -> None:
        self.script.streams += 1
        input_open = True
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
                try:
                    async for frame in ws:
                        if isinstance(frame, str):
                            await out.put(response_part(frame.encode(), "UTF8"))
                        else:
                            await out.put(response_part(frame, "BINARY"))
                except ConnectionClosed:
                    pass
                if input_open:  # the container closed first
                    await out.put(
                        exception(
                            "ModelStreamError",
                            "Model closed the stream",
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
        match = _PATH.match(request.destination.path or "")
        if match is None or match["name"] != self.script.endpoint:
            name = match["name"] if match else request.destination.path
            body = orjson.dumps({"message": f"Endpoint {name} of account 000000000000 not found."})
            self._spawn(_discard(request.body))  # as a server resets the stream
            fields = Fields(
                [
                    Field(name="x-amzn-errortype", values=["ValidationError"]),
                    Field(name="content-type", values=["application/json"]),
                ]
            )
            return HTTPResponse(status=400, fields=fields, body=body)
        out: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._spawn(self.bridge.run(request.body, out))

        async def response_body() -> AsyncIterator[bytes]:
            while (data := await out.get()) is not None:
                yield data

        fields = Fields([Field(name="content-type", values=["application/vnd.amazon.eventstream"])])
        return HTTPResponse(status=200, fields=fields, body=response_body())

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
