"""SageMaker bidirectional streaming (HTTP/2), the bidi transport in front of a SageMaker
endpoint running the model server: one stream per reply carrying every chunk.

Uses `aws-sdk-sagemaker-runtime-http2` (pinned) with the CRT transport, the one that can do
duplex, signing with credentials from botocore's chain (`aws_identity`), as the aioboto3 paths
do. Replies come back as PayloadParts: PARTIAL parts are joined, then each message is told
apart by the frame rule (a JSON object is control, anything else is audio). The input stream
stays open until the last audio has arrived; then `{"type": "close"}` and close.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

from gateway.aio import cancel_and_wait
from gateway.aws_errors import sagemaker_error
from gateway.errors import TTSError
from gateway.transports.aws_identity import BotocoreIdentityResolver
from gateway.transports.framed_stream import FrameCarrier, FramedSessions
from kokoro_contract import protocol


def default_endpoint_uri(region: str) -> str:
    return f"https://runtime.sagemaker.{region}.amazonaws.com:8443"


class SageMakerBidiTransport(FramedSessions):
    def __init__(
        self,
        endpoint_name: str,
        region: str,
        endpoint_uri: str | None = None,
        http_transport: Any = None,  # default: the SDK's CRT client; tests pass a seam
        tts_timeout_s: float | None = None,
        session: Any = None,  # the aiobotocore session whose credentials sign (default: new)
    ) -> None:
        self.endpoint_name = endpoint_name
        self.tts_timeout_s = tts_timeout_s
        self.region = region
        self.endpoint_uri = (
            endpoint_uri
            or os.environ.get("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME_HTTP2")
            or default_endpoint_uri(region)
        )
        self._http_transport = http_transport
        self._session = session
        self._client: Any = None
        self._lock = asyncio.Lock()

    async def _get_client(self) -> Any:
        async with self._lock:
            if self._client is None:
                from aws_sdk_sagemaker_runtime_http2.client import (
                    AsyncSageMakerRuntimeHTTP2Client,
                )
                from aws_sdk_sagemaker_runtime_http2.config import (
                    AsyncSageMakerRuntimeHTTP2Config,
                )

                transport = self._http_transport
                if transport is None:
                    from smithy_http.aio.crt import AWSCRTHTTPClient

                    transport = AWSCRTHTTPClient()
                session = self._session
                if session is None:
                    from aiobotocore.session import get_session

                    session = get_session()
                config = await AsyncSageMakerRuntimeHTTP2Config.resolve(
                    region=self.region,
                    endpoint_uri=self.endpoint_uri,
                    transport=transport,
                    aws_credentials_identity_resolver=BotocoreIdentityResolver(session),
                )
                self._client = AsyncSageMakerRuntimeHTTP2Client(config=config)
            return self._client

    @contextlib.asynccontextmanager
    async def connect(self) -> AsyncIterator[FrameCarrier]:
        """One bidirectional stream, its messages read into the carrier until it ends."""
        from aws_sdk_sagemaker_runtime_http2.models import (
            InvokeEndpointWithBidirectionalStreamInput,
            RequestPayloadPart,
            RequestStreamEventPayloadPart,
        )

        client = await self._get_client()
        try:
            stream = await client.invoke_endpoint_with_bidirectional_stream(
                InvokeEndpointWithBidirectionalStreamInput(endpoint_name=self.endpoint_name)
            )
        except Exception as exc:  # the SDK's errors share no base class worth naming here
            raise sagemaker_error(exc, self.endpoint_name) from exc

        writing = asyncio.Lock()

        async def write(frame: str) -> None:
            part = RequestPayloadPart(bytes_=frame.encode(), completion_state="COMPLETE")
            async with writing:
                await stream.input_stream.send(RequestStreamEventPayloadPart(value=part))

        async def send_frame(frame: str) -> None:
            # A signed event cut off mid-write would wedge the stream (the end frame would
            # never arrive): each write finishes even when its caller is cancelled.
            try:
                await asyncio.shield(asyncio.ensure_future(write(frame)))
            except Exception as exc:
                raise sagemaker_error(exc, self.endpoint_name) from exc

        carrier = FrameCarrier(send_frame, self.tts_timeout_s)
        reader = asyncio.create_task(self._read(stream, carrier))
        completed = False
        try:
            yield carrier
            completed = True
        finally:
            # a stream the service has already ended may never take more input: bounded waits
            ending = protocol.close_message() if completed else protocol.cancel_message()
            with contextlib.suppress(TTSError, TimeoutError):
                async with asyncio.timeout(5):
                    await asyncio.shield(send_frame(ending))
            with contextlib.suppress(Exception):
                async with asyncio.timeout(5):
                    await asyncio.shield(stream.input_stream.close())
            await cancel_and_wait(reader)

    async def _read(self, stream: Any, carrier: FrameCarrier) -> None:
        from aws_sdk_sagemaker_runtime_http2.models import ResponseStreamEventPayloadPart

        try:
            _, output = await stream.await_output()
            message = b""
            async for event in output:
                if not isinstance(event, ResponseStreamEventPayloadPart):
                    continue
                part = event.value
                message += part.bytes_ or b""
                if part.completion_state in (None, "COMPLETE"):
                    await carrier.received(message)
                    message = b""
        except Exception as exc:
            await carrier.failed(sagemaker_error(exc, self.endpoint_name))
            return
        await carrier.failed(TTSError("SageMaker closed the stream"))

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.close()
