"""A reply's one entry (`gateway.service.speak.speak`): it admits, builds and runs a reply and
gives everything back exactly once on every exit (its end, an error in its source, a consumer
that fails or is cancelled mid-stream, a barge-in, a consumer that never ran): the session,
the cancel handle, the model-server place, the active-replies gauge, the metrics recorded as
it ends; `CancelledError` reaches the caller. Over the real pool and a fake model server on
loopback; the test sources are registered in the source registry like any other."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from gateway.access.keys import Client
from gateway.config import Settings
from gateway.errors import BadRequest, LLMError
from gateway.params import SpeakParams
from gateway.reply.events import AgentEnd, AudioChunk, Cancelled, ErrorEvent, TextDelta
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.service import GatewayService
from gateway.service.speak import speak
from gateway.sources import registry
from gateway.sources.registry import Capabilities, Source, SourceKind, SourceRequest, Supplies
from tests.support.servers import RunningServer

WEB = Client("web")
HELLO = SpeakParams(text="Hello there.", format="pcm")
PROMPT = SpeakParams(prompt="Tell me.", format="pcm")


class ScriptedLLM:
    """An LLM's answer: its first delta, then a failure (`fails`) or a wait that only a cancel
    ends; `closed` once its stream is closed (the upstream given back)."""

    def __init__(self, fails: BaseException | None = None) -> None:
        self.fails = fails
        self.closed = False

    async def stream(self) -> AsyncGenerator[str]:
        try:
            yield "Hello there. "
            if self.fails is not None:
                raise self.fails
            await asyncio.Event().wait()  # the rest of the answer never comes
        finally:
            self.closed = True


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> list[ScriptedLLM]:
    """`--llm scripted`: each prompt is answered by the next `ScriptedLLM` in the list."""
    answers: list[ScriptedLLM] = []

    def make(kind: SourceKind, _request: SourceRequest, _supplies: Supplies) -> Source:
        return Source(kind, answers.pop(0))

    llm = Capabilities(
        answers_prompts=True,
        speaks_given_text=False,
        takes_client_text=False,
        paced=False,
        stop_reason=False,
        sends_prompt=False,
    )
    monkeypatch.setitem(registry.SOURCES, "scripted", SourceKind("scripted", llm, make))
    return answers


@contextlib.asynccontextmanager
async def service_on(fake_server: RunningServer, **settings: Any) -> AsyncIterator[GatewayService]:
    config = Settings(model_server_url=fake_server.http_url, admission=False, **settings)
    service = GatewayService(config)
    await service.start()
    try:
        yield service
    finally:
        await service.aclose()


def sample(service: GatewayService, name: str, **labels: str) -> float:
    return service.metrics.registry.get_sample_value(name, labels) or 0.0


def held(service: GatewayService, transport: str = "sse") -> tuple[int, int, int, float]:
    """(sessions open, cancellable replies, replies placed on model servers, active replies)."""
    gate = service.gate
    assert gate.runtime.pool is not None
    placed = sum(u.replies for u in gate.runtime.pool.upstreams)
    active = sample(service, "gateway_active_sessions", transport=transport)
    return gate.sessions.total, len(gate.live), placed, active


def recorded(service: GatewayService) -> tuple[float, float]:
    """(replies started, first audio times observed)."""
    replies = sample(service, "gateway_replies_total", mode="bidi", format="pcm")
    ttfa = sample(service, "gateway_time_to_first_audio_seconds_count", mode="bidi", format="pcm")
    return replies, ttfa


async def test_a_reply_spoken_to_its_end_gives_everything_back_once(
    fake_server: RunningServer,
) -> None:
    async with service_on(fake_server) as service:
        async with speak(service, WEB, HELLO, transport="sse", cancellable=True) as speech:
            assert held(service) == (1, 1, 1, 0)  # admitted; it runs once its events are asked
            events = [event async for event in speech]
            assert held(service) == (1, 1, 1, 1)  # ended, and still held until the block ends
        assert held(service) == (0, 0, 0, 0)
        speech.close()  # again, as a WebSocket reply's task does when it ends: nothing more
        assert held(service) == (0, 0, 0, 0)
        assert events[0].name == "agent_start"
        assert isinstance(events[-1], AgentEnd)
        assert any(isinstance(e, AudioChunk) for e in events)
        assert recorded(service) == (1, 1)  # counted and recorded once
        assert service.gate.sessions.of("web") == 0


@pytest.mark.parametrize("chunk_plan", ["playback", "sentences"])
async def test_admission_follows_the_plans_playback_and_none_of_the_sentences_plan(
    fake_server: RunningServer, chunk_plan: str
) -> None:
    """The playback plan tells admission its spare time (`Plan.playback`, the plan itself); the
    sentences plan has no deadlines to tell: its reply is followed with no plan."""
    async with (
        service_on(fake_server, chunk_plan=chunk_plan) as service,
        speak(service, WEB, HELLO, transport="sse") as speech,
    ):
        pool = service.gate.runtime.pool
        assert pool is not None
        (place,) = [p for upstream in pool.upstreams for p in upstream.placed]
        assert place.tracked
        if chunk_plan == "playback":
            assert isinstance(speech.reply.plan, ChunkPlan)
            assert place.plan is speech.reply.plan
        else:
            assert place.plan is None
        [event async for event in speech]


async def test_an_error_in_the_source_ends_the_events_and_gives_everything_back_once(
    fake_server: RunningServer, scripted: list[ScriptedLLM]
) -> None:
    llm = ScriptedLLM(fails=LLMError("the LLM broke", retryable=True))
    scripted.append(llm)
    async with service_on(fake_server, llm="scripted") as service:
        async with speak(service, WEB, PROMPT, transport="sse") as speech:
            events = [event async for event in speech]
        assert [e.code for e in events if isinstance(e, ErrorEvent)] == ["llm_error"]
        assert isinstance(events[-1], AgentEnd)
        assert llm.closed
        assert held(service) == (0, 0, 0, 0)
        assert sample(service, "gateway_errors_total", code="llm_error") == 1
        assert recorded(service)[0] == 1
        # an LLM reply's tokens are charged once, as it ends: its answer so far
        assert service.gate.token_rate.used("web", service.gate.clock()) == 4  # 13 chars / 4


async def test_a_consumer_cancelled_mid_stream_gives_everything_back_and_is_cancelled(
    fake_server: RunningServer, scripted: list[ScriptedLLM]
) -> None:
    llm = ScriptedLLM()
    scripted.append(llm)
    async with service_on(fake_server, llm="scripted") as service:
        spoken = asyncio.Event()

        async def listen() -> None:
            async with speak(service, WEB, PROMPT, transport="ws_reply") as speech:
                async for event in speech:
                    if isinstance(event, TextDelta):
                        spoken.set()  # the answer has begun; its rest never comes

        listener = asyncio.create_task(listen())
        await spoken.wait()
        assert held(service, "ws_reply") == (1, 0, 1, 1)
        listener.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listener
        assert listener.cancelled()
        assert llm.closed  # the LLM's stream was closed as the reply stopped
        assert held(service, "ws_reply") == (0, 0, 0, 0)
        assert recorded(service)[0] == 1
        assert sample(service, "gateway_errors_total", code="llm_error") == 0


async def test_a_consumer_that_fails_mid_stream_gives_everything_back(
    fake_server: RunningServer, scripted: list[ScriptedLLM]
) -> None:
    llm = ScriptedLLM()
    scripted.append(llm)
    async with service_on(fake_server, llm="scripted") as service:

        async def route() -> None:
            async with speak(service, WEB, PROMPT, transport="openai") as speech:
                async for event in speech:
                    if isinstance(event, TextDelta):
                        raise RuntimeError("the route failed")

        with pytest.raises(RuntimeError, match="the route failed"):
            await route()
        assert llm.closed
        assert held(service, "openai") == (0, 0, 0, 0)


async def test_a_barge_in_ends_the_events_with_what_was_heard(
    fake_server: RunningServer, scripted: list[ScriptedLLM]
) -> None:
    llm = ScriptedLLM()
    scripted.append(llm)
    async with service_on(fake_server, llm="scripted") as service:
        async with speak(service, WEB, PROMPT, transport="sse", cancellable=True) as speech:
            live = service.gate.live_reply(WEB, speech.utterance_id)
            assert live is not None
            events = []
            async for event in speech:
                events.append(event)
                if isinstance(event, TextDelta):
                    live.cancel.set_result(0.0)  # `POST /v1/speak/{id}/cancel`, nothing played
        assert isinstance(events[-1], Cancelled)
        assert (events[-1].played_ms, events[-1].heard_text) == (0.0, "")
        assert live.heard.result() == ""  # what the cancel's answer says
        assert not any(isinstance(e, AgentEnd) for e in events)
        assert llm.closed
        assert sample(service, "gateway_cancels_total") == 1
        assert held(service) == (0, 0, 0, 0)


async def test_a_reply_whose_consumer_never_ran_is_given_back_once(
    fake_server: RunningServer,
) -> None:
    """A WebSocket reply's task cancelled before it started closes its reply at once
    (`Speech.close`); the block's own end after it gives nothing back twice."""
    async with service_on(fake_server) as service:
        async with speak(service, WEB, HELLO, transport="ws_reply", client_text=True) as speech:
            speech.close()
            assert held(service, "ws_reply") == (0, 0, 0, 0)
            assert [event async for event in speech] == []  # closed: nothing more
        assert held(service, "ws_reply") == (0, 0, 0, 0)
        assert service.gate.sessions.of("web") == 0
        assert recorded(service) == (1, 0)


async def test_a_request_refused_before_admission_holds_nothing(
    fake_server: RunningServer,
) -> None:
    async with service_on(fake_server) as service:
        with pytest.raises(BadRequest) as refused:  # neither text nor prompt, and no client text
            async with speak(service, WEB, SpeakParams(format="pcm"), transport="sse"):
                pass
        assert refused.value.code == "missing_text"
        assert held(service) == (0, 0, 0, 0)
        assert recorded(service) == (0, 0)
        assert service.gate.reply_rate.used("web", service.gate.clock()) == 0


async def test_a_client_text_reply_speaks_what_the_client_sends(
    fake_server: RunningServer,
) -> None:
    async with service_on(fake_server) as service:
        params = SpeakParams(format="pcm")
        async with speak(service, WEB, params, transport="ws_reply", client_text=True) as speech:
            assert speech.client_text is not None
            assert speech.client_text.offer("My own words.")
            speech.client_text.end()
            text = [e.text async for e in speech if isinstance(e, TextDelta)]
        assert text == ["My own words."]
        assert speech.client_text.closed  # its queue is closed with the reply
        assert held(service, "ws_reply") == (0, 0, 0, 0)
