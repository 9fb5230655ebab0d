"""The gateway's runtime: shared HTTP client, model-server transport, metrics, and the one
place where a request becomes a running reply."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from gateway.admission import Refusal
from gateway.aio import cancel_and_wait
from gateway.auth import Client, KeyRing
from gateway.chunk_plan import ChunkPlan, PlanConfig, SpeechRate
from gateway.chunker import ChunkerConfig
from gateway.config import Settings
from gateway.encoders import create_encoder
from gateway.errors import Overloaded, TTSError
from gateway.events import Event
from gateway.metrics import GatewayMetrics
from gateway.params import SpeakParams
from gateway.pipeline import Reply, ReplySpec
from gateway.quotas import Lease, PerMinute, Sessions
from gateway.retry import RetryPolicy
from gateway.sources.base import TextSource
from gateway.sources.bedrock import BedrockOptions, BedrockSource
from gateway.sources.client import ClientTextSource
from gateway.sources.echo import EchoSource
from gateway.sources.openai_chat import OpenAIChatSource
from gateway.speak_session import new_utterance_id
from gateway.transports.base import BatchTransport, BidiTransport
from gateway.transports.pool import ModelServerPool, PooledTransport
from gateway.transports.resuming import ResumingTransport
from gateway.transports.sagemaker_bidi import SageMakerBidiTransport
from gateway.transports.sagemaker_stream import SageMakerStreamTransport
from kokoro_contract import limits
from kokoro_contract.formats import AudioFormat
from kokoro_contract.speed import SpeedModel


def load_keys(settings: Settings) -> KeyRing | None:
    """The API keys from `--api-keys-file` and `--api-keys` together; None when neither."""
    lines = [k for k in settings.api_keys.split(",") if k.strip()]
    if settings.api_keys_file:
        try:
            with open(settings.api_keys_file, encoding="utf-8") as f:
                lines += f.read().splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read --api-keys-file: {exc.strerror}") from exc
        if not any(line.strip() and not line.lstrip().startswith("#") for line in lines):
            raise ValueError(f"--api-keys-file {settings.api_keys_file} holds no key")
    return KeyRing.parse(lines) if lines else None


@dataclass
class LiveReply:
    """An SSE reply that `POST /v1/speak/{id}/cancel` can stop: the cancel hands over
    `played_ms`; the stream answers with what was heard."""

    reply: Reply
    cancel: asyncio.Future[float | None] = field(default_factory=asyncio.Future)
    heard: asyncio.Future[str | None] = field(default_factory=asyncio.Future)


@dataclass
class _Held:
    """What a reply holds until it ends (never the reply itself: it is a weak key)."""

    llm_client: str | None  # charged for the answer's tokens
    releases: list[Callable[[], None]] = field(default_factory=list)


class GatewayService:
    def __init__(self, settings: Settings, sagemaker_http2_transport: Any = None) -> None:
        """`sagemaker_http2_transport` replaces the HTTP/2 SDK's CRT client (tests)."""
        self.settings = settings
        # one connection per session at most, waited for at most 5 s (then a clean error)
        self.client = httpx.AsyncClient(
            timeout=httpx.Timeout(30.0, connect=5.0, pool=5.0),
            limits=httpx.Limits(
                max_connections=settings.max_sessions + 16,
                max_keepalive_connections=min(64, settings.max_sessions),
            ),
        )
        self.retry = RetryPolicy(attempts=max(1, settings.retry_attempts))
        self.pool: ModelServerPool | None = None
        self.bidi: BidiTransport
        self.batch: BatchTransport
        if settings.tts_transport == "sagemaker":
            if not settings.sagemaker_endpoint:
                raise ValueError(
                    "--tts-transport sagemaker needs --sagemaker-endpoint "
                    "(GATEWAY_SAGEMAKER_ENDPOINT)"
                )
            self.bidi = SageMakerBidiTransport(
                settings.sagemaker_endpoint,
                self.aws_region(),
                settings.sagemaker_http2_endpoint_uri or None,
                sagemaker_http2_transport,
                settings.tts_timeout_s,
            )
        else:
            urls = [u.strip() for u in settings.model_server_url.split(",") if u.strip()]
            self.pool = ModelServerPool(urls, self.client, tts_timeout_s=settings.tts_timeout_s)
        self.metrics = GatewayMetrics()
        self.keys = load_keys(settings)
        self.wall_clock: Callable[[], float] = time.time  # token expiry
        self._no_sessions = asyncio.Event()
        self.sessions = Sessions(
            settings.max_sessions, settings.max_sessions_per_client, self._no_sessions.set
        )
        self.draining = asyncio.Event()  # set on SIGTERM (gateway.cli)
        self.live: dict[tuple[str, str], LiveReply] = {}  # (client, utterance id) -> SSE reply
        self.metrics.sessions.set_function(lambda: self.sessions.total)
        pool = self.pool
        if pool is not None:
            self.metrics.admission_waiting.set_function(lambda: pool.waiting)
        self.reply_rate = PerMinute(settings.replies_per_minute, "replies")
        self.token_rate = PerMinute(settings.llm_tokens_per_minute, "LLM tokens")
        self.clock: Callable[[], float] = time.monotonic
        # what a reply holds until it ends: its session, its place on a model server
        self._held: weakref.WeakKeyDictionary[Reply, _Held] = weakref.WeakKeyDictionary()
        self._exits = contextlib.AsyncExitStack()
        self._bedrock: Any = None  # an aioboto3 bedrock-runtime client, for --llm bedrock
        self.chunker = ChunkerConfig(
            first_min_words=settings.first_min_words, first_max_words=settings.first_max_words
        )
        self.plan = PlanConfig(
            first_hold_s=settings.first_hold_s,
            first_min_words=settings.first_min_words,
            first_max_words=settings.first_max_words,
            first_wait_words=max(settings.first_wait_words, settings.first_max_words),
        )
        # seconds per chunk against its characters, as the model server reports them: one
        # estimate for every reply, since they share the engine
        # (prior: int8 ONNX on 2 cores, through the stack: 0.35 s a call, 0.032 s a character)
        self.speed = SpeedModel(prior_a=0.35, prior_b=0.032)
        self.speech = SpeechRate()

    def aws_region(self) -> str:
        region = (
            self.settings.aws_region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
        )
        if not region:
            raise ValueError(
                "SageMaker needs a region: --aws-region (GATEWAY_AWS_REGION) or AWS_REGION"
            )
        return region

    async def start(self) -> None:
        import aioboto3
        from botocore.config import Config

        # Retries happen above the SDK, only where nothing was said yet (gateway.retry); a
        # connection per session, waited for at most 5 s
        config = Config(
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=60,
            max_pool_connections=self.settings.max_sessions,
        )
        region = self.settings.aws_region or None
        if self.settings.llm == "bedrock":
            self._bedrock = await self._exits.enter_async_context(
                aioboto3.Session().client("bedrock-runtime", region_name=region, config=config)
            )
        if self.settings.tts_transport == "sagemaker":
            runtime = await self._exits.enter_async_context(
                aioboto3.Session().client(
                    "sagemaker-runtime", region_name=self.aws_region(), config=config
                )
            )
            self.batch = SageMakerStreamTransport(runtime, self.settings.sagemaker_endpoint)
            assert isinstance(self.bidi, SageMakerBidiTransport)
            self._exits.push_async_callback(self.bidi.close)

    async def tts_ready(self) -> tuple[bool, str]:
        """(ready, what) for /readyz: the model server answers /ping; a SageMaker endpoint is
        not probed (that needs the control-plane API), only configured."""
        if self.pool is not None:
            return await self.pool.ready(), self.settings.model_server_url
        return True, f"sagemaker:{self.settings.sagemaker_endpoint}"

    async def voices(self) -> dict[str, Any]:
        if self.pool is not None:
            chosen = await self.pool.pick(None)
            if isinstance(chosen, Refusal):
                raise TTSError(f"model server unreachable: {chosen.reason}")
            return await chosen.transport.voices()
        return {"default": self.settings.default_voice, "voices": []}

    def open_session(self, client: Client) -> Lease:
        """A session (a WebSocket, or one HTTP reply) for `client`; raises `Overloaded` (the
        gateway is full or restarting) or `TooManySessions` (this client has its share)."""
        if self.draining.is_set():
            raise Overloaded("the gateway is restarting: retry", code="restarting", retry_after_s=1)
        return self.sessions.open(client.name)

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

    def check_rates(self, client: Client, prompt: bool) -> None:
        """Raises `RateLimited` when `client` has used its replies (or, for a prompt, its LLM
        tokens) of the last minute; counts the reply otherwise."""
        now = self.clock()
        self.reply_rate.check(client.name, now)
        if prompt:
            self.token_rate.check(client.name, now)
        self.reply_rate.charge(client.name, 1, now)

    async def admit(self, client: Client, prompt: bool) -> tuple[BidiTransport, BatchTransport]:
        """The transports for a new reply, on the model server that should take it; raises
        `RateLimited` when the client has had its share, `Overloaded` when no model server can
        serve it in time (before anything is streamed)."""
        if self.draining.is_set():  # a WebSocket's next reply, while restarting
            raise Overloaded("the gateway is restarting: retry", code="restarting", retry_after_s=1)
        self.check_rates(client, prompt)
        bidi, batch = await self._route()
        deadline = asyncio.get_running_loop().time() + self.settings.first_audio_budget_s
        resuming = ResumingTransport(
            bidi, batch, self.retry, deadline, lambda *_: self.metrics.retries.labels("tts").inc()
        )
        return resuming, resuming

    async def _route(self) -> tuple[BidiTransport, BatchTransport]:
        if self.pool is None:
            return self.bidi, self.batch  # SageMaker routes and scales by itself
        budget = self.settings.first_audio_budget_s if self.settings.admission else None
        loop = asyncio.get_running_loop()
        asked = loop.time()
        chosen = await self.pool.admit(budget, self.settings.admission_wait_s)
        if budget is not None:
            self.metrics.admission_wait.observe(loop.time() - asked)
        if isinstance(chosen, Refusal):
            self.metrics.refused.labels(chosen.code).inc()
            what = "at capacity" if chosen.code == "overloaded" else "unavailable"
            raise Overloaded(
                f"the speech service is {what}: {chosen.reason}; retry shortly",
                code=chosen.code,
                retry_after_s=chosen.retry_after_s,
            )
        return chosen, chosen

    async def aclose(self) -> None:
        await self._exits.aclose()
        if self.pool is not None:
            await self.pool.aclose()
        await self.client.aclose()

    def source_for(
        self, params: SpeakParams, history: Sequence[dict[str, str]] = ()
    ) -> TextSource | None:
        """The text source a request asks for; None when the client streams its own text."""
        if params.text is not None:
            text = limits.check_text(params.text, self.settings.max_text_chars, "text")
            return EchoSource(text, params.echo_tps, params.echo_first_ms)
        if params.prompt is not None:
            limits.check_text(params.prompt, self.settings.max_text_chars, "prompt")
            if self.settings.llm == "echo":
                return EchoSource(params.prompt, params.echo_tps, params.echo_first_ms)
            turns = [*history, {"role": "user", "content": params.prompt}]
            if self.settings.llm == "bedrock":
                options = BedrockOptions(
                    self.settings.bedrock_model_id,
                    max_tokens=self.settings.max_tokens,
                    temperature=self.settings.temperature,
                    retry=self.retry,
                    first_token_budget_s=self.settings.first_audio_budget_s,
                    on_retry=self._llm_retried,
                )
                return BedrockSource(self._bedrock, options, self.settings.system_prompt, turns)
            messages = [{"role": "system", "content": self.settings.system_prompt}, *turns]
            return OpenAIChatSource(
                self.client,
                self.settings.openai_base_url,
                self.settings.openai_model,
                messages,
                self.settings.openai_api_key,
                max_tokens=self.settings.max_tokens,
                temperature=self.settings.temperature,
                retry=self.retry,
                first_token_budget_s=self.settings.first_audio_budget_s,
                on_retry=self._llm_retried,
            )
        return None

    def _llm_retried(self, _error: BaseException, _wait: float) -> None:
        self.metrics.retries.labels("llm").inc()

    def reply(
        self,
        params: SpeakParams,
        source: TextSource,
        out: asyncio.Queue[Event | None],
        *,
        transports: tuple[BidiTransport, BatchTransport],
        client: Client,
        lease: Lease | None = None,
        utterance_id: str | None = None,
        audio_format: AudioFormat | None = None,
    ) -> Reply:
        """A reply to `params` over the `transports` that `admit()` gave, for `client`, holding
        `lease` (its HTTP session) until it ends; `audio_format` overrides the browser format
        they name (the OpenAI route's formats)."""
        spec = ReplySpec(
            utterance_id=utterance_id or params.utterance_id or new_utterance_id(),
            mode=params.mode,
            format=audio_format or params.audio_format,
            voice=params.voice or self.settings.default_voice or None,
            speed=params.speed,
            # timings from the TTS when asked for, and for LLM answers: what a listener who
            # interrupts has heard is what the conversation keeps
            timestamps=params.timestamps or params.prompt is not None,
            words_events=params.timestamps,
        )
        self.metrics.replies.labels(spec.mode, spec.format.name).inc()
        plan = None
        if self.settings.chunk_plan == "playback":

            def plan() -> ChunkPlan:
                return ChunkPlan(self.plan, self.speed, self.speech, speed_factor=spec.speed)

        encoder = create_encoder(spec.format)
        bidi, batch = transports
        stall = None if isinstance(source, ClientTextSource) else self.settings.llm_timeout_s
        reply = Reply(
            spec,
            source,
            encoder,
            bidi,
            batch,
            out,
            self.chunker,
            plan,
            max_s=self.settings.max_reply_s,
            text_stall_s=stall,
        )
        held = _Held(client.name if params.prompt is not None else None)
        if lease is not None:
            held.releases.append(lease.release)
        routed = bidi.bidi if isinstance(bidi, ResumingTransport) else bidi
        if isinstance(routed, PooledTransport):
            held.releases.append(routed.release)
            routed.track(reply.plan)
        self._held[reply] = held
        for release in held.releases:  # released when the reply ends (running), or if it
            weakref.finalize(reply, release)  # never runs (its client left first)
        return reply

    def _release(self, reply: Reply) -> None:
        held = self._held.pop(reply, None)
        if held is None:
            return
        for release in held.releases:
            release()
        if held.llm_client is not None:
            # an LLM answer's tokens, estimated as 4 characters each (no usage reaches here)
            tokens = math.ceil(reply.metrics.text_chars / 4)
            self.token_rate.charge(held.llm_client, tokens, self.clock())

    def record(self, reply: Reply) -> None:
        if reply.metrics.ttfa_ms is not None:
            self.metrics.ttfa.labels(reply.spec.mode, reply.spec.format.name).observe(
                reply.metrics.ttfa_ms / 1000
            )
        if reply.error is not None:
            self.metrics.errors.labels(reply.error.code).inc()

    @contextlib.asynccontextmanager
    async def running(self, reply: Reply, transport: str) -> AsyncIterator[asyncio.Task[None]]:
        """Run a reply as a task for as long as the caller listens; cancel it when they stop."""
        self.metrics.active.labels(transport).inc()
        task = asyncio.create_task(reply.run(), name=f"reply-{reply.spec.utterance_id}")
        try:
            yield task
        finally:
            try:
                await cancel_and_wait(task)
            finally:
                self._release(reply)
                self.metrics.active.labels(transport).dec()
                self.record(reply)
