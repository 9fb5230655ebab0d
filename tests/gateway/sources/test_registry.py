"""The text sources' registry (`gateway.sources.registry`): an unknown source is refused with the
names it could be, `--llm`'s choices are the sources that answer prompts, and each registered
source does what its capabilities declare, built through the registry and streamed (the LLMs
over in-memory upstreams: an httpx mock transport, a scripted Bedrock client)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest

from gateway.config import Settings, parse_settings
from gateway.retry import NO_RETRY
from gateway.service import GatewayService
from gateway.sources.base import FlushMark
from gateway.sources.echo import tokens
from gateway.sources.registry import (
    LLMS,
    SOURCES,
    Capabilities,
    Source,
    SourceRequest,
    Supplies,
    kind_for,
    llm_kind,
    source_kind,
)

ASKED = "Hello there, my friend."  # the request's text, or its prompt
ANSWER = ["Sure, it is ", "a fine day."]  # what an LLM streams back
OWN = "The client's own words."  # what a WebSocket client sends
HISTORY = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello."}]


def test_an_unknown_source_is_refused_with_the_names_it_could_be() -> None:
    with pytest.raises(ValueError, match=r"unknown text source 'nope'; one of echo, openai, "):
        source_kind("nope")
    with pytest.raises(ValueError, match="answers no prompt; --llm is one of echo, openai"):
        llm_kind("client")
    with pytest.raises(ValueError, match="unknown text source 'nope'"):  # at start, not per reply
        GatewayService(Settings(llm="nope"))
    with pytest.raises(SystemExit):
        parse_settings(["--llm", "client"])


def test_the_llm_choices_are_the_sources_that_answer_prompts() -> None:
    assert LLMS == ("echo", "openai", "bedrock")
    assert parse_settings(["--llm", "bedrock"]).llm == "bedrock"


def test_a_request_gets_its_text_its_llm_or_its_clients_text() -> None:
    llm = SOURCES["bedrock"]
    assert kind_for(text=True, prompt=False, llm=llm) is SOURCES["echo"]
    assert kind_for(text=False, prompt=True, llm=llm) is llm
    assert kind_for(text=False, prompt=False, llm=llm) is SOURCES["client"]


@dataclass
class Upstreams:
    """What the LLM sources were asked: the user turn each request ended with."""

    asked: list[str] = field(default_factory=list)

    def openai(self, request: httpx.Request) -> httpx.Response:
        self.asked.append(orjson.loads(request.content)["messages"][-1]["content"])
        chunks = [{"choices": [{"delta": {"content": text}}]} for text in ANSWER]
        body = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks)
        return httpx.Response(200, content=body + b"data: [DONE]\n\n")

    def bedrock(self) -> ScriptedBedrock:
        return ScriptedBedrock(self)


class ScriptedBedrock:
    """The part of aioboto3's bedrock-runtime client a source uses: ConverseStream's events."""

    def __init__(self, upstreams: Upstreams) -> None:
        self.upstreams = upstreams

    async def converse_stream(self, **request: Any) -> dict[str, Any]:
        self.upstreams.asked.append(request["messages"][-1]["content"][0]["text"])
        events: list[dict[str, Any]] = [
            {"contentBlockDelta": {"delta": {"text": text}}} for text in ANSWER
        ]
        events += [{"messageStop": {"stopReason": "max_tokens"}}, {"metadata": {"usage": {}}}]
        return {"stream": EventStream(events)}


class EventStream:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    async def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        for event in self.events:
            yield event

    def close(self) -> None:
        pass


async def streamed(source: Source) -> list[str]:
    if source.client_text is not None:  # the client sends its text, then flushes
        source.client_text.offer(OWN)
        source.client_text.end()
    deltas = [delta async for delta in source.text.stream()]
    assert not any(isinstance(d, FlushMark) for d in deltas)  # nobody flushed
    return [d for d in deltas if isinstance(d, str)]


@pytest.mark.parametrize("name", list(SOURCES))
async def test_each_source_does_what_it_declares(name: str) -> None:
    upstreams = Upstreams()
    async with httpx.AsyncClient(transport=httpx.MockTransport(upstreams.openai)) as llm_client:
        supplies = Supplies(Settings(), llm_client, upstreams.bedrock, NO_RETRY)
        kind = SOURCES[name]
        paced = kind.build(SourceRequest(ASKED, HISTORY, tps=1000), supplies)
        unpaced = kind.build(SourceRequest(ASKED, HISTORY), supplies)
        paced_deltas = await streamed(paced)
        deltas = await streamed(unpaced)
    text = "".join(deltas)
    reason = None if unpaced.stop_reason is None else unpaced.stop_reason()
    does = Capabilities(
        # its text is the prompt itself, or an answer an upstream was asked for it
        answers_prompts=text == ASKED or ASKED in upstreams.asked,
        speaks_given_text=text == ASKED,
        takes_client_text=unpaced.client_text is unpaced.text and text == OWN,
        # word by word when asked to be paced, at once when not
        paced=paced_deltas == tokens(ASKED) and deltas == [ASKED],
        stop_reason=reason == "max_tokens",
        sends_prompt=unpaced.prompt_chars >= len(ASKED) + sum(len(t["content"]) for t in HISTORY),
    )
    assert does == kind.capabilities
    assert unpaced.kind is kind
    assert unpaced.capabilities is kind.capabilities
    # what a capability promises comes with it, and only with it
    assert (unpaced.stop_reason is not None) == kind.capabilities.stop_reason
    assert (unpaced.client_text is not None) == kind.capabilities.takes_client_text
    assert (unpaced.prompt_chars > 0) == kind.capabilities.sends_prompt
