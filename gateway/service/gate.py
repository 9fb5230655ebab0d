"""The gate: who may start a reply now, and what a reply holds in the gateway's shared
accounting while it runs.

`Gate.start()` admits a reply: in one step it takes the session (an HTTP reply's own; a
WebSocket brings the connection's), checks that the client has no reply of that id playing
and registers it (so a cancel can find it, for its key and token subject alone), charges the
per-minute rates (a token's subject's within its key's), waits for admission (the model server
that can serve it in time, or a refusal) and reserves its place there; one session's replies
(a WebSocket's contexts) are admitted one at a time, in the order they were started, so that
its later ones wait behind its earlier one rather than each ask for one of the client's places
in the line of replies waiting for spare time (`InTurn`); on every exit it gives
all of it back, in one place (`Admitted.close`). An LLM reply's tokens, the prompt and history
it sent and the answer it got, are charged as the reply ends (`Admitted.settle`), before the
client reads its end. A refusal at any step gives back what the steps before it took.

The gate knows nothing of the reply it admitted: `gateway.service.speak`, which admits, builds
and runs a reply, tells it what to follow (`Admitted.follow`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from gateway.access.keys import Client
from gateway.access.quotas import (
    Lease,
    PerMinute,
    Sessions,
    rate_limited,
    too_many_sessions,
)
from gateway.aio import Clock, loop_time
from gateway.config import Settings
from gateway.errors import BadRequest, Overloaded
from gateway.fleet.cancels import HEARD_S, FleetCancels, Stopped
from gateway.fleet.limits import SharedLimits, Window
from gateway.metrics import GatewayMetrics
from gateway.retry import RetryBudget
from gateway.routing.admission import InProgress, Refusal
from gateway.routing.pool import PooledTransport
from gateway.service.runtime import Runtime
from gateway.transports.base import BatchTransport, SessionTransport
from gateway.transports.resuming import ResumingTransport


@dataclass
class LiveReply:
    """An SSE reply that `POST /v1/speak/{id}/cancel` can stop: the cancel hands over
    `played_ms`; the stream answers with what was heard."""

    cancel: asyncio.Future[float | None] = field(default_factory=asyncio.Future)
    heard: asyncio.Future[str | None] = field(default_factory=asyncio.Future)


class Admitted:
    """A reply's place from admission to its end. `transports` are its TTS (retried until its
    first audio, on the server admission chose); `live` its cancel handle when it has one."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.transports: ResumingTransport | None = None
        self.live: LiveReply | None = None
        self.text_chars: Callable[[], int] = lambda: 0  # the answer's text so far (the reply's)
        self.prompt_chars = 0  # what the reply sends its LLM: system prompt, history, prompt
        self._placement: PooledTransport | None = None
        self._releases: list[Callable[[], None]] = []
        self._charges: list[Callable[[], None]] = []  # what the reply used, charged once
        self._settled = False
        self._closed = False

    @property
    def tts(self) -> ResumingTransport:
        assert self.transports is not None, "not admitted yet"
        return self.transports

    @property
    def alone(self) -> bool:
        """The model server admission chose had nothing else to do (False where the gateway
        cannot tell: SageMaker routes by itself)."""
        return self._placement is not None and self._placement.alone

    @property
    def progressive(self) -> bool:
        """The model server admission chose says it speaks progressively (False where the
        gateway cannot tell: SageMaker routes by itself)."""
        return self._placement is not None and self._placement.progressive

    def follow(
        self,
        text_chars: Callable[[], int],
        prompt_chars: int,
        plan: InProgress | None,
        waiting: Callable[[], bool] | None,
    ) -> None:
        """What the gate reads of the reply it admitted, from now on: the answer's characters
        so far and what it sent its LLM (an LLM reply's tokens, charged as it ends), its plan
        and whether it waits for its client's text (`track`)."""
        self.text_chars = text_chars
        self.prompt_chars = prompt_chars
        self.track(plan, waiting)

    def track(self, plan: InProgress | None, waiting: Callable[[], bool] | None = None) -> None:
        """The reply's playback plan: admission reads its spare time from now on; `waiting`,
        for a reply whose client sends its text: whether it waits for that text with nothing
        asked of the engine (then it holds no place others need: `PooledTransport.track`)."""
        if self._placement is not None:
            self._placement.track(plan, waiting)

    def settle(self) -> None:
        """Charge the client what the reply used (an LLM answer's tokens), once: the reply
        calls this as it ends, before its `agent_end` reaches the client, so the client's
        next request already counts it; `close` does it for a reply that stopped short."""
        if self._settled:
            return
        self._settled = True
        for charge in self._charges:
            charge()

    def close(self) -> None:
        """Settle and give back everything the reply holds (once; any later call does
        nothing)."""
        if self._closed:
            return
        self._closed = True
        self.settle()
        if self.live is not None and not self.live.heard.done():
            self.live.heard.set_result(None)  # a cancel waiting for it hears nothing more
        for release in reversed(self._releases):
            release()


class InTurn:
    """One session's new replies, admitted one at a time in the order they were started."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()  # fair: its waiters go in arrival order
        self.behind = 0  # replies waiting for the one before them to be admitted

    @contextlib.asynccontextmanager
    async def turn(self) -> AsyncIterator[None]:
        self.behind += 1
        try:
            await self._lock.acquire()
        finally:
            self.behind -= 1
        try:
            yield
        finally:
            self._lock.release()


class Gate:
    def __init__(self, settings: Settings, metrics: GatewayMetrics, runtime: Runtime) -> None:
        self.settings = settings
        self.metrics = metrics
        self.runtime = runtime
        self._no_sessions = asyncio.Event()
        self.sessions = Sessions(
            settings.max_sessions,
            settings.max_sessions_per_client,
            self._no_sessions.set,
            max_per_subject=settings.max_sessions_per_subject,
        )
        self.draining = asyncio.Event()  # set on SIGTERM (gateway.cli)
        # (`Client.holder`, utterance id) -> SSE reply: a token's visitor has ids of its own
        self.live: dict[tuple[str, str], LiveReply] = {}
        # each WebSocket's session -> its replies' admission in turn, gone with the session
        self.turns: weakref.WeakKeyDictionary[Lease, InTurn] = weakref.WeakKeyDictionary()
        self.reply_rate = PerMinute(settings.replies_per_minute, "replies")
        self.subject_reply_rate = PerMinute(
            settings.replies_per_minute_per_subject, "replies", who="token subject"
        )
        self.token_rate = PerMinute(settings.llm_tokens_per_minute, "LLM tokens")
        # with a fleet's store: the same sessions and windows counted across every gateway
        # (and here too, which is what counts while the store is down)
        self.shared: SharedLimits | None = None
        self.cancels: FleetCancels | None = None  # and a cancel of a reply another one holds
        store = runtime.store
        if store is not None:
            self.cancels = FleetCancels(store, self.cancel_here)
            self.shared = SharedLimits(
                store,
                lease_ttl_s=settings.fleet_lease_ttl_s,
                max_fleet_sessions=settings.max_fleet_sessions,
                max_per_client=settings.max_sessions_per_client,
                max_per_subject=settings.max_sessions_per_subject,
            )
            store.on_round_trip = metrics.fleet_round_trip.observe
            store.on_change.append(
                lambda up: metrics.fleet_changes.labels("up" if up else "down").inc()
            )
            metrics.fleet_up.set_function(lambda: 1 if store.up else 0)
        # every time the gate reads (rates, admission's wait, first-audio deadlines): the loop's
        self.clock: Clock = loop_time
        metrics.sessions.set_function(lambda: self.sessions.total)
        pool = runtime.pool
        if pool is not None:
            metrics.admission_waiting.set_function(lambda: pool.waiting)

    async def start_fleet(self) -> None:
        """The fleet's heartbeat, with a store (the app's start)."""
        if self.shared is not None:
            await self.shared.start()
        if self.cancels is not None:
            await self.cancels.start()

    async def aclose(self) -> None:
        if self.cancels is not None:
            await self.cancels.aclose()
        if self.shared is not None:
            await self.shared.aclose()

    def _check_open(self) -> None:
        if self.draining.is_set():
            raise Overloaded("the gateway is restarting: retry", code="restarting", retry_after_s=1)
        store = self.runtime.store
        if store is not None and not store.up and self.settings.redis_required:
            raise Overloaded(
                "the limits this service shares are out of reach; retry shortly",
                code="fleet_unavailable",
                retry_after_s=5,
            )

    async def open_session(self, client: Client) -> Lease:
        """A session (a WebSocket, or one HTTP reply) for `client`; raises `Overloaded` (the
        gateway or the fleet is full, restarting, or its store is out of reach with
        `--redis-required`) or `TooManySessions` (this client, or this token's subject within
        it, has its share)."""
        self._check_open()
        subject = _subject(client)
        lease = self.sessions.open(client.name, subject)
        if self.shared is None:
            return lease
        shared = self.shared
        try:
            held, full = await shared.open_session(client.name, subject)
        except BaseException:
            lease.release()
            raise
        if full is not None:
            lease.release()
            raise too_many_sessions(full.which, full.count)
        lease.also = lambda: shared.close_session(held)
        return lease

    def live_reply(self, client: Client, utterance_id: str) -> LiveReply | None:
        """The SSE reply `utterance_id` that `client` may cancel: one it started (the same
        key, and the same token subject); the key itself may cancel its tokens' replies too."""
        live = self.live.get((client.holder, utterance_id))
        if live is not None or client.via != "key":
            return live
        return next(
            (
                live
                for (holder, uid), live in self.live.items()
                if uid == utterance_id and holder.partition(" ")[0] == client.name
            ),
            None,
        )

    async def cancel(
        self, client: Client, utterance_id: str, played_ms: float | None
    ) -> Stopped | None:
        """Barge-in for the SSE reply `utterance_id` of `client`'s, here or on another gateway
        of the fleet: stopped, with what its listener heard; None when no gateway holds it."""
        stopped = await self.cancel_here(client, utterance_id, played_ms)
        if stopped is None and self.cancels is not None:
            stopped = await self.cancels.cancel(client, utterance_id, played_ms)
        return stopped

    async def cancel_here(
        self, client: Client, utterance_id: str, played_ms: float | None
    ) -> Stopped | None:
        live = self.live_reply(client, utterance_id)
        if live is None:
            return None
        if not live.cancel.done():
            live.cancel.set_result(played_ms)
        try:
            heard = await asyncio.wait_for(asyncio.shield(live.heard), timeout=HEARD_S)
        except TimeoutError:  # the reply could not stop in time: it is stopping all the same
            heard = None
        return Stopped(heard)

    async def drain(self, timeout_s: float) -> int:
        """Stop taking new sessions and wait (at most `timeout_s`) for the open ones to end:
        replies finish, idle WebSockets close with 1012 at once and busy ones after their
        reply. Returns how many were still open."""
        self.draining.set()
        if self.sessions.total:
            self._no_sessions.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):
                    await self._no_sessions.wait()
        return self.sessions.total

    @contextlib.asynccontextmanager
    async def start(
        self,
        client: Client,
        *,
        prompt: bool,
        session: Lease | None = None,
        cancellable: str | None = None,
    ) -> AsyncIterator[Admitted]:
        """A new reply's place, held until the block ends. `session`: the WebSocket's own (an
        HTTP reply takes one); `cancellable`: the utterance id a cancel names (SSE). Raises,
        before anything is streamed and holding nothing: `Overloaded` (restarting, full, or no
        model server can serve it in time), `TooManySessions`, `BadRequest` (`busy`: that id
        is playing), `RateLimited`."""
        admitted = await self._admit(client, prompt, session, cancellable)
        try:
            yield admitted
        finally:
            admitted.close()

    async def _admit(
        self, client: Client, prompt: bool, session: Lease | None, cancellable: str | None
    ) -> Admitted:
        self._check_open()  # a WebSocket's next reply, while restarting
        admitted = Admitted(client)
        try:
            if session is None:
                lease = await self.open_session(client)
                admitted._releases.append(lease.release)
                turn: contextlib.AbstractAsyncContextManager[None] = contextlib.nullcontext()
            else:
                turn = self.turns.setdefault(session, InTurn()).turn()
            if cancellable is not None:
                key = (client.holder, cancellable)
                if key in self.live:
                    raise BadRequest(f"utterance {cancellable!r} is already playing", code="busy")
                live = admitted.live = self.live[key] = LiveReply()
                admitted._releases.append(lambda: self._unregister(key, live))
            await self._charge_rates(client, prompt)
            if prompt:
                admitted._charges.append(lambda: self._charge_tokens(admitted))
            async with turn:
                admitted.transports = await self._route(admitted)
        except BaseException:
            admitted.close()
            raise
        return admitted

    def _unregister(self, key: tuple[str, str], live: LiveReply) -> None:
        if self.live.get(key) is live:
            del self.live[key]

    async def _charge_rates(self, client: Client, prompt: bool) -> None:
        """Raises `RateLimited` when `client` (its key, and a token's subject within it) has
        used its replies (or, for a prompt, its LLM tokens) of the last minute, here or, with
        a fleet's store, across the fleet; counts the reply otherwise (a prompt's tokens are
        counted at its end)."""
        subject = _subject(client)
        windows = [(self.reply_rate, client.name, 1)]
        if subject is not None:
            windows.append((self.subject_reply_rate, subject, 1))
        if prompt:
            windows.append((self.token_rate, client.name, 0))
        for rate, name, _ in windows:
            rate.check(name, self.clock())
        if self.shared is not None:
            used = await self.shared.charge(
                [Window(_window(rate, name), rate.limit, amount) for rate, name, amount in windows]
            )
            if used is not None:
                rate = windows[used.index][0]
                raise rate_limited(used.used, rate.what, rate.who, rate.limit, used.wait_s)
        now = self.clock()
        for rate, name, amount in windows:
            rate.charge(name, amount, now)

    def _charge_tokens(self, admitted: Admitted) -> None:
        # an LLM reply's tokens, what it sent (input) and its answer (output), estimated as 4
        # characters each (no usage reaches here)
        tokens = math.ceil((admitted.prompt_chars + admitted.text_chars()) / 4)
        name = admitted.client.name
        self.token_rate.charge(name, tokens, self.clock())
        if self.shared is not None:
            self.shared.charge_later([Window(_window(self.token_rate, name), 0, tokens)])

    async def _route(self, admitted: Admitted) -> ResumingTransport:
        """The reply's TTS on the model server that should take it, its place reserved there
        until the reply ends; raises `Overloaded` when none can serve it in time."""
        budget = RetryBudget(
            self.runtime.retry,
            on_retry=lambda *_: self.metrics.retries.labels("tts").inc(),
            clock=self.clock,
        )
        bidi: SessionTransport
        batch: BatchTransport
        pool = self.runtime.pool
        if pool is None:  # SageMaker routes and scales by itself
            bidi, batch = self.runtime.bidi, self.runtime.batch
        else:
            settings = self.settings
            wait_budget = settings.first_audio_budget_s if settings.admission else None
            asked = self.clock()
            chosen = await pool.admit(
                wait_budget,
                settings.admission_wait_s,
                budget,
                client=admitted.client.holder,
                per_client=settings.admission_waiting_per_client,
            )
            if wait_budget is not None:
                self.metrics.admission_wait.observe(self.clock() - asked)
            if isinstance(chosen, Refusal):
                self.metrics.refused.labels(chosen.code).inc()
                what = "at capacity" if chosen.code == "overloaded" else "unavailable"
                raise Overloaded(
                    f"the speech service is {what}: {chosen.reason}; retry shortly",
                    code=chosen.code,
                    retry_after_s=chosen.retry_after_s,
                )
            admitted._placement = chosen
            admitted._releases.append(chosen.release)
            bidi = batch = chosen
        budget.deadline = self.clock() + self.settings.first_audio_budget_s
        # after audio, only a pool can resume a reply elsewhere: SageMaker's stream would be
        # opened on the same endpoint, which just broke it
        return ResumingTransport(bidi, batch, budget, resume_after_audio=pool is not None)


def _window(rate: PerMinute, name: str) -> str:
    """A per-minute window's name in the fleet's store."""
    return f"{rate.what}:{rate.who}".replace(" ", "-") + f":{name}"


def _subject(client: Client) -> str | None:
    """What a token's visitor is counted as (`Client.holder`); None for a key's own."""
    return client.holder if client.subject is not None else None
