"""`bedrock`: Amazon Bedrock's ConverseStream through aioboto3.

Region and credentials follow the AWS SDKs' default chain (refreshing credentials keep working);
`AWS_ENDPOINT_URL_BEDROCK_RUNTIME` points the client elsewhere (the local emulator). Throttling
and unavailability before the first text are retried with backoff; after it they end the reply
with a retryable error. Validation and access errors name the setting to fix; settings Bedrock
would refuse (a temperature over 1) fail at start, and an empty system prompt is not sent.
`messageStop` gives the answer's stop reason (`max_tokens`, `guardrail_intervened`, ...), kept
as `stop_reason` for the reply's end, and `metadata` its token usage; both go to `on_stop`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError, ParamValidationError

from gateway.aws_errors import bedrock_error
from gateway.errors import LLMError
from gateway.retry import DEFAULT_RETRY, OnRetry, RetryPolicy, retrying


@dataclass(frozen=True)
class BedrockOptions:
    model_id: str
    max_tokens: int = 512
    temperature: float = 0.5
    retry: RetryPolicy = DEFAULT_RETRY
    first_token_budget_s: float | None = None  # retries stop when the next could not start
    on_retry: OnRetry | None = None
    on_stop: Callable[[str, dict[str, int]], None] | None = None  # stop reason, token usage


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
        # what each request sends, in characters (the per-minute token limit counts it)
        sent = [system] if system.strip() else []  # an empty system prompt is not sent
        self.prompt_chars = sum(map(len, sent)) + sum(len(m["content"]) for m in messages)
        self.stop_reason: str | None = None  # from messageStop, once the answer has ended
        self._usage: dict[str, int] = {}

    def _request(self) -> dict[str, Any]:
        opts = self._options
        if not 0.0 <= opts.temperature <= 1.0:
            raise LLMError(
                f"Bedrock takes a temperature from 0 to 1, not {opts.temperature} "
                "(GATEWAY_TEMPERATURE)",
                retryable=False,
            )
        request: dict[str, Any] = {
            "modelId": opts.model_id,
            "messages": self._messages,
            "inferenceConfig": {"maxTokens": opts.max_tokens, "temperature": opts.temperature},
        }
        if self._system.strip():  # Bedrock refuses an empty system block
            request["system"] = [{"text": self._system}]
        return request

    async def _attempt(self) -> Any:
        opts = self._options
        try:
            return await self._client.converse_stream(**self._request())
        except ParamValidationError as exc:  # a setting the service model refuses: final
            raise LLMError(f"Bedrock refused the request: {exc}", retryable=False) from exc
        except ClientError as exc:
            raise bedrock_error(exc, opts.model_id) from exc
        except BotoCoreError as exc:  # connection refused, endpoint not resolving, timeouts
            raise LLMError(
                "Bedrock is unreachable", retryable=True, detail=f"Bedrock unreachable: {exc}"
            ) from exc

    async def _until_first_text(self) -> tuple[Any, AsyncIterator[Any], str | None]:
        """Open the stream and read it up to its first text: an error event before that (a
        `ModelStreamErrorException`, throttling) is as safe to retry as a refused call."""
        events = (await self._attempt())["stream"]
        items = aiter(events)
        try:
            async for item in items:
                if text := self._read(item):
                    return events, items, text
            return events, items, None
        except (ClientError, BotoCoreError) as exc:
            events.close()
            raise self._error(exc) from exc
        except BaseException:
            events.close()
            raise

    def _error(self, exc: ClientError | BotoCoreError) -> LLMError:
        if isinstance(exc, ClientError):  # an exception event in the stream
            return bedrock_error(exc, self._options.model_id)
        return LLMError(
            "Bedrock's stream failed", retryable=True, detail=f"Bedrock stream failed: {exc}"
        )

    async def stream(self) -> AsyncGenerator[str]:
        opts = self._options
        budget = opts.first_token_budget_s
        deadline = None if budget is None else asyncio.get_running_loop().time() + budget
        # nothing was said yet: throttling and unavailability are retried (gateway.retry)
        events, items, first = await retrying(
            self._until_first_text, opts.retry, deadline=deadline, on_retry=opts.on_retry
        )
        try:
            if first is not None:
                yield first
            async for item in items:
                if text := self._read(item):
                    yield text
        except (ClientError, BotoCoreError) as exc:  # after text: never retried silently
            raise self._error(exc) from exc
        finally:
            events.close()  # releases the HTTP connection, also when the client went away
        if opts.on_stop is not None and self.stop_reason is not None:
            opts.on_stop(self.stop_reason, self._usage)

    def _read(self, item: dict[str, Any]) -> str | None:
        """The text of a stream event; notes the stop reason and the usage on the way."""
        if "messageStop" in item:
            self.stop_reason = str(item["messageStop"].get("stopReason", "unknown"))
        elif "metadata" in item:
            usage = item["metadata"].get("usage", {})
            self._usage = {k: int(v) for k, v in usage.items() if isinstance(v, int)}
        return _text(item)


def _text(item: dict[str, Any]) -> str | None:
    delta = item.get("contentBlockDelta")
    if delta is None:
        return None
    text = delta.get("delta", {}).get("text")
    return text if isinstance(text, str) and text else None
