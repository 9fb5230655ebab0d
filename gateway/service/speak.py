"""One entry for every route that speaks: `speak()` admits a reply, builds it, runs it and
yields its events, and on every exit gives back everything the reply held, once. The routes
(SSE and AgentCore's invocations, OpenAI's speech, each utterance of a WebSocket) only adapt the
wire.

    async with speak(service, client, params, transport="sse") as speech:
        async for event in speech:
            ...  # the wire's own framing of each event

Where a reply's state lives, and why there:
- what it holds in the gateway's shared accounting (its session, its cancel handle, its rates,
  its place on a model server, its LLM tokens) stays with the gate (`Admitted`): every reply
  shares those tables, and the gate gives all of it back in one place;
- the reply itself (its source, plan, encoder, the words it spoke) is the pipeline's `Reply`,
  which the factory builds without knowing where, or whether, it was admitted;
- what joins the two while the reply runs (its task, the active-replies gauge, the client's
  text queue, the metrics recorded as it ends) is `Speech`'s, made and ended here alone.

So one function knows both sides: it tells the gate what to follow of the reply
(`Admitted.follow`) and ends everything in one order, whatever ended the reply (its end, an
error, a client gone, a cancel): the run, cancelled and waited for; the gauge and the
metrics; the client's text queue; then the admission. `CancelledError` goes on to the caller.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from gateway.access.keys import Client
from gateway.access.quotas import Lease
from gateway.aio import cancel_and_wait
from gateway.metrics import GatewayMetrics
from gateway.params import Buffering, SpeakParams
from gateway.reply.events import Cancelled, Event
from gateway.reply.pipeline import Reply
from gateway.service.gate import Admitted
from gateway.sources.client import ClientTextSource
from gateway.speak_ws.session import new_utterance_id
from kokoro_contract.formats import AudioFormat

if TYPE_CHECKING:
    from gateway.service import GatewayService


class Speech:
    """A reply being spoken, as the route that asked for it sees it: an async iterator of the
    reply's events in order, `agent_start` to `agent_end`; a reply that `POST
    /v1/speak/{id}/cancel` stopped ends with `cancelled` instead, saying what was heard. The
    reply runs from the first event asked for until its events end or `speak` ends."""

    def __init__(
        self,
        reply: Reply,
        events: asyncio.Queue[Event | None],
        admitted: Admitted,
        client_text: ClientTextSource | None,
        metrics: GatewayMetrics,
        transport: str,
    ) -> None:
        self.reply = reply
        self.client_text = client_text  # where the client's deltas go, when it sends its text
        self._events = events
        self._admitted = admitted
        self._metrics = metrics
        self._transport = transport
        self._task: asyncio.Task[None] | None = None
        self._ended = False  # the events have all been given
        self._closed = False

    @property
    def utterance_id(self) -> str:
        return self.reply.spec.utterance_id

    def heard(self, played_ms: float) -> str:
        """What the listener heard of the reply, having played `played_ms` of it."""
        return self.reply.heard(played_ms)

    def __aiter__(self) -> Speech:
        return self

    async def __anext__(self) -> Event:
        if self._ended or self._closed:
            raise StopAsyncIteration
        if self._task is None:
            self._metrics.active.labels(self._transport).inc()
            self._task = asyncio.create_task(self.reply.run(), name=f"reply-{self.utterance_id}")
        event = await self._next()
        if event is not None:
            return event
        self._ended = True
        live = self._admitted.live
        if live is None or not live.cancel.done():
            raise StopAsyncIteration
        # a barge-in: stop, then say what was heard
        await cancel_and_wait(self._task)
        played = live.cancel.result()
        heard = None if played is None else self.reply.heard(played)
        live.heard.set_result(heard)
        self._metrics.cancels.inc()
        return Cancelled(self.utterance_id, played, heard)

    async def _next(self) -> Event | None:
        """The reply's next event; None at its end, or once a cancel has come for it."""
        live = self._admitted.live
        if live is None:
            return await self._events.get()
        if live.cancel.done():
            return None
        getting = asyncio.ensure_future(self._events.get())
        try:
            waits: set[asyncio.Future[Any]] = {getting, live.cancel}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not getting.done():
                getting.cancel()
        if getting.cancelled() or not getting.done():
            return None
        return getting.result()

    async def aclose(self) -> None:
        """Stop the reply and wait until it has stopped (its source and TTS stream closed),
        then give back everything it held (`close`)."""
        try:
            if self._task is not None:
                await cancel_and_wait(self._task)
        finally:
            self.close()

    def close(self) -> None:
        """Give back everything the reply holds, without waiting for anything, once (later
        calls do nothing): the gauge and the metrics of a reply that ran, the client's text
        queue (a reader still there ends), the admission. For a consumer that never ran (a
        WebSocket reply's task cancelled before it started: its reply never ran either);
        `speak` itself ends through `aclose`."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._task is not None:
                self._task.cancel()  # nothing once it has ended (`aclose` waited for that)
                self._metrics.active.labels(self._transport).dec()
                self._record()
        finally:
            if self.client_text is not None:
                self.client_text.close()
            self._admitted.close()

    def _record(self) -> None:
        reply = self.reply
        if reply.metrics.ttfa_ms is not None:
            self._metrics.ttfa.labels(reply.spec.mode, reply.spec.format.name).observe(
                reply.metrics.ttfa_ms / 1000
            )
        if reply.error is not None:
            self._metrics.errors.labels(reply.error.code).inc()


@contextlib.asynccontextmanager
async def speak(
    service: GatewayService,
    client: Client,
    params: SpeakParams,
    *,
    transport: str,
    history: Sequence[dict[str, str]] = (),
    session: Lease | None = None,
    cancellable: bool = False,
    client_text: bool = False,
    utterance_id: str | None = None,
    audio_format: AudioFormat | None = None,
    buffering: Buffering = Buffering.GATEWAY,
) -> AsyncIterator[Speech]:
    """A reply to `params` for `client`, held until the block ends: its events are the
    `Speech` given. `transport` labels it in the active-replies gauge (`sse`, `openai`,
    `ws_reply`); `history`: the conversation before a prompt; `session`: a WebSocket's own
    (an HTTP reply takes one); `cancellable`: `POST /v1/speak/{id}/cancel` may stop it (SSE);
    `client_text`: the caller sends the text itself when the request has neither text nor
    prompt (the WebSocket: `Speech.client_text` takes it); `audio_format` overrides the
    browser format `params` name (OpenAI's formats); `buffering`: who cuts the client's text
    (`Buffering.CLIENT`: its flushes, the WebSocket's protocol 2).

    Raises, before anything is streamed and holding nothing: `BadRequest` (the source's checks,
    `gateway.service.replies.ReplyFactory.source_for`; then `unknown_voice`; `busy`),
    `Overloaded`, `TooManySessions`, `RateLimited` (`gateway.service.gate.Gate.start`)."""
    replies = service.replies
    source = replies.source_for(params, history, client_text=client_text)
    # a voice no model server has: 400 before anything is streamed
    voice = await replies.voices.resolve(params.voice, lambda: replies.saved.of(client.name))
    params = params.model_copy(update={"voice": voice})
    # the lexicon it reads with, this version to its end (400 unknown_lexicon)
    lexicon = await replies.lexicons.for_reply(client.name, params.lexicon)
    uid = utterance_id or params.utterance_id or new_utterance_id()
    async with service.gate.start(
        client,
        prompt=params.prompt is not None,
        session=session,
        cancellable=uid if cancellable else None,
    ) as admitted:
        events: asyncio.Queue[Event | None] = asyncio.Queue(service.settings.queue_size)
        reply = replies.build(
            params,
            source,
            events,
            admitted.tts,
            alone=admitted.alone,
            progressive=admitted.progressive,
            on_end=admitted.settle,
            utterance_id=uid,
            audio_format=audio_format,
            buffering=buffering,
            lexicon=lexicon,
        )
        # a plan with deadlines gives admission its spare time (`Plan.playback`); the sentences
        # plan has none.
        # A reply whose client sends its text asks for synthesis only with that text: while
        # it waits for it, it holds no place on its model server
        takes_client_text = source.capabilities.takes_client_text
        admitted.follow(
            lambda: reply.metrics.text_chars,
            source.prompt_chars,  # an LLM's input counts as tokens too
            reply.plan.playback,
            reply.waiting_for_text if takes_client_text else None,
        )
        speech = Speech(reply, events, admitted, source.client_text, service.metrics, transport)
        try:
            yield speech
        finally:
            await speech.aclose()
