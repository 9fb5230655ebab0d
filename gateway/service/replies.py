"""The reply factory: a request's text source, its chunk plan (over the speeds every reply
learns together, owned here), its encoder, and the running of a reply as a task for as long as
its client listens."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

from gateway.aio import cancel_and_wait
from gateway.config import Settings
from gateway.encoders import create_encoder
from gateway.errors import BadRequest
from gateway.metrics import GatewayMetrics
from gateway.params import SpeakParams
from gateway.reply.chunk_plan import (
    ChunkPlan,
    EarlyAudio,
    Plan,
    PlanConfig,
    SentencePlan,
    SpeechRate,
    chunk_speed,
)
from gateway.reply.chunker import ChunkerConfig
from gateway.reply.events import Event
from gateway.reply.pipeline import Reply, ReplySpec
from gateway.service.gate import Admitted
from gateway.service.runtime import Runtime
from gateway.service.voices import VoiceCatalog, parse_table
from gateway.sources.base import TextSource
from gateway.sources.bedrock import BedrockOptions, BedrockSource
from gateway.sources.client import ClientTextSource
from gateway.sources.echo import EchoSource
from gateway.sources.openai_chat import OpenAIChatSource
from gateway.speak_ws.session import new_utterance_id
from kokoro_contract import limits
from kokoro_contract.formats import AudioFormat
from kokoro_contract.listen import is_loopback
from kokoro_contract.speed import SpeedModel
from kokoro_contract.spoken import spoken_s


def plan_config(settings: Settings) -> PlanConfig:
    return PlanConfig(
        first_hold_s=settings.first_hold_s,
        first_slack_s=settings.first_slack_s,
        first_min_words=settings.first_min_words,
        first_max_words=settings.first_max_words,
        first_wait_words=max(settings.first_wait_words, settings.first_max_words),
    )


def chunker_config(settings: Settings) -> ChunkerConfig:
    """The `sentences` plan's chunker."""
    return ChunkerConfig(
        first_min_words=settings.first_min_words, first_max_words=settings.first_max_words
    )


class ReplyFactory:
    def __init__(self, settings: Settings, metrics: GatewayMetrics, runtime: Runtime) -> None:
        self.settings = settings
        self.metrics = metrics
        self.runtime = runtime
        self.voices = VoiceCatalog(runtime.voices, parse_table(settings.openai_voices))
        self.chunker = chunker_config(settings)
        self.plan = plan_config(settings)
        # what every reply's plan learns and reads (they share the engine): seconds per chunk
        # against its characters, as the model server reports them, and characters spoken
        # per second
        self.speed = chunk_speed()
        self.speech = SpeechRate()
        # and seconds to a chunk's first audio, which the plans read once the model server
        # shows it speaks progressively (its first audio before its last; until then, the
        # whole chunk's time): a front pass over the chunk and its first window, which hardly
        # grows with the chunk (prior: 0.35 s, 2 ms a character, the front pass's share)
        self.first_audio = SpeedModel(prior_a=0.35, prior_b=0.002)
        self.early = EarlyAudio()  # and how much audio that first frame holds

    def source_for(
        self, params: SpeakParams, history: Sequence[dict[str, str]] = ()
    ) -> TextSource | None:
        """The text source a request asks for; None when the client streams its own text.
        Raises `BadRequest`: `echo_pacing_disabled` (pacing asked of a gateway beyond loopback
        without `--echo-pacing`), `reply_too_long` (text given whole that would speak longer
        than `--max-reply-audio-s`)."""
        settings = self.settings
        if (params.echo_tps or params.echo_first_ms) and not self.echo_pacing:
            raise BadRequest(
                "echo_tps and echo_first_ms (the echo source's pacing) are for demos and "
                "benchmarks: this gateway does not honour them",
                code="echo_pacing_disabled",
            )
        if params.text is not None:
            text = limits.check_text(params.text, settings.max_text_chars, "text")
            self._check_spoken(text, params.speed)
            return EchoSource(text, params.echo_tps, params.echo_first_ms)
        if params.prompt is None:
            return None
        limits.check_text(params.prompt, settings.max_text_chars, "prompt")
        if settings.llm == "echo":
            self._check_spoken(params.prompt, params.speed)
            return EchoSource(params.prompt, params.echo_tps, params.echo_first_ms)
        turns = [*history, {"role": "user", "content": params.prompt}]
        if settings.llm == "bedrock":
            options = BedrockOptions(
                settings.bedrock_model_id,
                max_tokens=settings.max_tokens,
                temperature=settings.temperature,
                retry=self.runtime.retry,
                first_token_budget_s=settings.first_audio_budget_s,
                on_retry=self._llm_retried,
                on_stop=self._llm_stopped,
            )
            return BedrockSource(self.runtime.bedrock, options, settings.system_prompt, turns)
        messages = [{"role": "system", "content": settings.system_prompt}, *turns]
        return OpenAIChatSource(
            self.runtime.llm_client,  # never the model servers' (their key is theirs)
            settings.openai_base_url,
            settings.openai_model,
            messages,
            settings.openai_api_key,
            max_tokens=settings.max_tokens,
            temperature=settings.temperature,
            retry=self.runtime.retry,
            first_token_budget_s=settings.first_audio_budget_s,
            on_retry=self._llm_retried,
        )

    @property
    def echo_pacing(self) -> bool:
        """Whether the echo source's pacing is honoured: on a loopback listener, or with
        `--echo-pacing` (demos and benchmarks)."""
        return self.settings.echo_pacing or is_loopback(self.settings.host)

    def _check_spoken(self, text: str, speed: float) -> None:
        """Raises `BadRequest` (`reply_too_long`) for text that would speak longer than
        `--max-reply-audio-s` (estimated: `kokoro_contract.spoken`)."""
        limit = self.settings.max_reply_audio_s
        if limit and (estimate := spoken_s(text, speed)) > limit:
            raise BadRequest(
                f"the text would speak about {estimate:.0f} s; the limit is {limit:.0f} s",
                code="reply_too_long",
            )

    def _llm_retried(self, _error: BaseException, _wait: float) -> None:
        self.metrics.retries.labels("llm").inc()

    def _llm_stopped(self, reason: str, usage: dict[str, int]) -> None:
        self.metrics.llm_stops.labels(reason).inc()
        for kind in ("inputTokens", "outputTokens"):
            if kind in usage:
                self.metrics.llm_tokens.labels(kind).inc(usage[kind])

    def build(
        self,
        params: SpeakParams,
        source: TextSource,
        out: asyncio.Queue[Event | None],
        admitted: Admitted,
        *,
        utterance_id: str | None = None,
        audio_format: AudioFormat | None = None,
    ) -> Reply:
        """A reply to `params` in the place `admitted` holds for it; `audio_format` overrides
        the browser format they name (the OpenAI route's formats)."""
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
        plan: Plan
        if self.settings.chunk_plan == "playback":
            if admitted.progressive:  # its first reply already planned for windows
                self.early.assume()
            plan = ChunkPlan(
                self.plan,
                self.speed,
                self.speech,
                spec.speed,
                first_speed=self.first_audio,
                early=self.early,
                alone=admitted.alone,
            )
        else:
            plan = SentencePlan(self.chunker)
        stall = None if isinstance(source, ClientTextSource) else self.settings.llm_timeout_s
        tts = admitted.tts
        reply = Reply(
            spec,
            source,
            create_encoder(spec.format),
            tts,
            tts,
            out,
            plan,
            max_s=self.settings.max_reply_s,
            text_stall_s=stall,
            on_end=admitted.settle,
            max_audio_s=self.settings.max_reply_audio_s or None,
        )
        admitted.text_chars = lambda: reply.metrics.text_chars
        if isinstance(source, OpenAIChatSource | BedrockSource):  # its input tokens count too
            admitted.prompt_chars = source.prompt_chars
        # a plan with deadlines gives admission its spare time; the sentences plan has none.
        # A reply whose client sends its text asks for synthesis only with that text: while
        # it waits for it, it holds no place on its model server
        waiting = reply.waiting_for_text if isinstance(source, ClientTextSource) else None
        admitted.track(plan if isinstance(plan, ChunkPlan) else None, waiting)
        return reply

    def _record(self, reply: Reply) -> None:
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
                self.metrics.active.labels(transport).dec()
                self._record(reply)
