"""`openai`: any OpenAI-compatible `/chat/completions` stream (vLLM, Ollama, llama.cpp)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import httpx
import orjson

from gateway.errors import LLMError
from gateway.sse import SSEDecoder


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
    ) -> None:
        self._client = client
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._messages = list(messages)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._limits: dict[str, Any] = {"max_tokens": max_tokens}
        if temperature is not None:
            self._limits["temperature"] = temperature

    async def stream(self) -> AsyncGenerator[str]:
        body = {"model": self._model, "messages": self._messages, "stream": True, **self._limits}
        try:
            async with self._client.stream(
                "POST", self._url, json=body, headers=self._headers
            ) as response:
                if response.status_code != 200:
                    detail = (await response.aread())[:300].decode(errors="replace")
                    raise LLMError(
                        f"LLM at {self._url} answered {response.status_code}: {detail}",
                        retryable=response.status_code in (408, 429) or response.status_code >= 500,
                    )
                decoder = SSEDecoder()
                async for chunk in response.aiter_bytes():
                    for event in decoder.push(chunk):
                        if event.data.strip() == "[DONE]":
                            return
                        text = _delta_text(event.data)
                        if text:
                            yield text
        except httpx.HTTPError as exc:
            raise LLMError(f"LLM at {self._url} unreachable: {exc}") from exc


def _delta_text(data: str) -> str:
    try:
        obj: Any = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise LLMError(f"LLM sent a chunk that is not JSON: {data[:100]!r}") from exc
    if "error" in obj:
        raise LLMError(f"LLM error: {obj['error']}")
    choices = obj.get("choices") or []
    if not choices:
        return ""
    delta = choices[0].get("delta") or {}
    content = delta.get("content")
    return content if isinstance(content, str) else ""
