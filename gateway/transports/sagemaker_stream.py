"""SageMaker `InvokeEndpointWithResponseStream` (aioboto3): the batch transport in front of a
SageMaker endpoint running the model server.

The endpoint's `POST /invocations` streams PCM; SageMaker re-cuts it into PayloadParts whose
boundaries mean nothing (not even sample boundaries: the encoders realign). `ModelStreamError`
and `InternalStreamFailure` become `TTSError`s. Region, credentials and
`AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME` follow the AWS SDKs' conventions.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

import orjson
from botocore.exceptions import BotoCoreError, ClientError

from gateway.aws_errors import sagemaker_error
from gateway.errors import TTSError
from gateway.transports.base import Piece
from gateway.transports.captioned import captioned_pieces
from kokoro_contract.protocol import TextOptions, invocation_body


class SageMakerStreamTransport:
    def __init__(self, client: Any, endpoint_name: str) -> None:
        self._client = client  # an aioboto3 sagemaker-runtime client
        self.endpoint_name = endpoint_name

    async def synthesize(
        self,
        text: str,
        voice: str | None,
        speed: float,
        timestamps: bool = False,
        options: TextOptions | None = None,
    ) -> AsyncGenerator[Piece]:
        body = invocation_body(text, voice, speed, timestamps, options)
        try:
            response = await self._client.invoke_endpoint_with_response_stream(
                EndpointName=self.endpoint_name,
                Body=orjson.dumps(body),
                ContentType="application/json",
                Accept="application/json" if timestamps else "audio/pcm",
            )
        except ClientError as exc:
            raise sagemaker_error(exc, self.endpoint_name) from exc
        except BotoCoreError as exc:
            raise TTSError(
                "SageMaker is unreachable", detail=f"SageMaker unreachable: {exc}"
            ) from exc
        events = response["Body"]
        captioned: list[bytes] = []  # with timestamps: one JSON answer, in parts
        try:
            async for event in events:
                part = event.get("PayloadPart")
                if part is not None and part.get("Bytes"):
                    if timestamps:
                        captioned.append(part["Bytes"])
                    else:
                        yield part["Bytes"]
            if timestamps:
                for piece in captioned_pieces(b"".join(captioned)):
                    yield piece
        except ClientError as exc:  # ModelStreamError / InternalStreamFailure mid-stream
            raise sagemaker_error(exc, self.endpoint_name) from exc
        except BotoCoreError as exc:
            raise TTSError(
                "SageMaker's stream failed", detail=f"SageMaker stream failed: {exc}"
            ) from exc
        finally:
            events.close()
