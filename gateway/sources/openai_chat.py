"""`openai`: any OpenAI-compatible `/chat/completions` stream (vLLM, Ollama, llama.cpp).

Refused connections, 408, 429 and 5xx before the first token are retried by the shared policy
(`gateway.retry`); once text has flowed, a failure ends the reply with a retryable error."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx
import orjson

from gateway.errors import LLMError
from gateway.retry import NO_RETRY, OnRetry, RetryPolicy, retrying
from gateway.sources.sse import SSEDecoder


class OpenAIChatSource:
    def __init__(
        self,
        client: httpx.AsyncClient,
        base_url: str,
        model: str,
        messages: Sequence[dict[str, str]],
        api_key: str = "",
        max_tokens: int = 512,
        temperature: float | None = None,
        retry: RetryPolicy = NO_RETRY,
        first_token_budget_s: float | None = None,
        on_retry: OnRetry | None = None,
    ) -> None:
        """`client` is the LLM's own (the gateway's other clients carry other services'
        credentials): each request carries `Authorization: Bearer <api_key>` when `api_key`
        is given, and no credential otherwise. `retry` applies until `first_token_budget_s`
        from the start of the stream."""
        self._client = client
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._messages = list(messages)
        # what each request sends, in characters (the per-minute token limit counts it)
        self.prompt_chars = sum(len(m["content"]) for m in self._messages)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._limits: dict[str, Any] = {"max_tokens": max_tokens}
        if temperature is not None:
            self._limits["temperature"] = temperature
        self._retry = retry
        self._budget_s = first_token_budget_s
        self._on_retry = on_retry

    async def _open(self) -> httpx.Response:
        """The streamed response, once the server has said 200."""
        body = {"model": self._model, "messages": self._messages, "stream": True, **self._limits}
        request = self._client.build_request("POST", self._url, json=body, headers=self._headers)
        try:
            response = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise LLMError(
                "the LLM is unreachable",
                retryable=True,
                detail=f"LLM at {self._url} unreachable: {exc}",
            ) from exc
        if response.status_code == 200:
            return response
        try:
            detail = (await response.aread())[:300].decode(errors="replace")
        except httpx.HTTPError:
            detail = ""
        finally:
            await response.aclose()
        status = response.status_code
        raise LLMError(
            f"the LLM answered {status}",
            retryable=status in (408, 429) or status >= 500,
            detail=f"LLM at {self._url} answered {status}: {detail}",
        )

    async def stream(self) -> AsyncGenerator[str]:
        loop = asyncio.get_running_loop()
        deadline = None if self._budget_s is None else loop.time() + self._budget_s
        response = await retrying(
            self._open, self._retry, deadline=deadline, on_retry=self._on_retry
        )
        try:
            decoder = SSEDecoder()
            async for chunk in response.aiter_bytes():
                for event in decoder.push(chunk):
                    if event.data.strip() == "[DONE]":
                        return
                    text = _delta_text(event.data)
                    if text:
                        yield text
        except httpx.HTTPError as exc:
            raise LLMError(
                "the LLM's stream failed",
                retryable=True,
                detail=f"LLM stream from {self._url} failed: {exc}",
            ) from exc
        finally:
            await response.aclose()


def _delta_text(data: str) -> str:
    try:
        obj: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise LLMError(
            "the LLM sent a chunk that is not JSON",
            detail=f"LLM sent a chunk that is not JSON: {data[:100]!r}",
        ) from exc
    if "error" in obj:
        raise LLMError("the LLM sent an error", detail=f"LLM error: {obj['error']}")
    choices = obj.get("choices") or []
    if not choices:
        return ""
    delta = choices[0].get("delta") or {}
    content = delta.get("content")
    return content if isinstance(content, str) else ""
