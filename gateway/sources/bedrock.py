"""`bedrock`: Amazon Bedrock's ConverseStream through aioboto3.

Region and credentials follow the AWS SDKs' default chain (refreshing credentials keep working);
`AWS_ENDPOINT_URL_BEDROCK_RUNTIME` points the client elsewhere (the local emulator). Throttling
and unavailability before the first text are retried with backoff; after it they end the reply
with a retryable error. Validation and access errors name the setting to fix.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gateway.aws_errors import bedrock_error, describe, retryable
from gateway.errors import LLMError


@dataclass(frozen=True)
class BedrockOptions:
    model_id: str
    max_tokens: int = 512
    temperature: float = 0.5
    max_attempts: int = 4
    backoff_s: float = 0.2


class BedrockSource:
    def __init__(
        self,
        client: Any,  # an aioboto3 bedrock-runtime client, shared by all replies
        options: BedrockOptions,
        system: str,
        messages: Sequence[dict[str, str]],
    ) -> None:
        self._client = client
        self._options = options
        self._system = system
        self._messages = [
            {"role": m["role"], "content": [{"text": m["content"]}]} for m in messages
        ]

    async def _open(self) -> Any:
        opts = self._options
        for attempt in range(1, opts.max_attempts + 1):
            try:
                return await self._client.converse_stream(
                    modelId=opts.model_id,
                    messages=self._messages,
                    system=[{"text": self._system}],
                    inferenceConfig={"maxTokens": opts.max_tokens, "temperature": opts.temperature},
                )
            except ClientError as exc:
                if retryable(describe(exc)[0]) and attempt < opts.max_attempts:
                    # nothing was said yet: retry with jittered exponential backoff
                    await asyncio.sleep(
                        opts.backoff_s * 2 ** (attempt - 1) * random.uniform(0.5, 1.5)
                    )
                    continue
                raise bedrock_error(exc, opts.model_id) from exc
            except BotoCoreError as exc:
                raise LLMError(f"Bedrock unreachable: {exc}") from exc
        raise AssertionError("unreachable")

    async def stream(self) -> AsyncGenerator[str]:
        response = await self._open()
        events = response["stream"]
        try:
            async for item in events:
                delta = item.get("contentBlockDelta")
                if delta is not None:
                    text = delta.get("delta", {}).get("text")
                    if text:
                        yield text
        except ClientError as exc:  # an exception event mid-stream (EventStreamError)
            raise bedrock_error(exc, self._options.model_id) from exc
        except BotoCoreError as exc:
            raise LLMError(f"Bedrock stream failed: {exc}", retryable=True) from exc
        finally:
            events.close()  # releases the HTTP connection, also when the client went away
