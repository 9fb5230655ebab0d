"""The reply factory: a request's text source (chosen through `gateway.sources.registry`), its
chunk plan (over the speeds every reply learns together, owned here) and its encoder, built into
a `Reply`. The factory only builds: where a reply runs, what it holds and when it ends are
`gateway.service.speak`'s."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from gateway.config import Settings
from gateway.encoders import create_encoder
from gateway.errors import BadRequest
from gateway.metrics import GatewayMetrics
from gateway.params import Buffering, SpeakParams
from gateway.reply.chunker import ChunkerConfig
from gateway.reply.events import Event
from gateway.reply.pipeline import Reply, ReplySpec
from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.reply.plan.protocol import Plan
from gateway.reply.plan.rates import EarlyAudio, SpeechRate, chunk_speed
from gateway.reply.plan.sentence_plan import SentencePlan, client_plan
from gateway.service.lexicons import Lexicons, load_file
from gateway.service.runtime import Runtime
from gateway.service.voices import SavedBlends, VoiceCatalog, parse_table
from gateway.sources.registry import Source, SourceRequest, Supplies, kind_for, llm_kind
from gateway.speak_ws.session import new_utterance_id
from gateway.transports.resuming import ResumingTransport
from kokoro_contract import limits, markup
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.formats import AudioFormat
from kokoro_contract.lexicon import Lexicon
from kokoro_contract.listen import is_loopback
from kokoro_contract.protocol import TextOptions
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
        self.saved = SavedBlends(store=runtime.store)  # each client's named blends
        deployment = load_file(settings.lexicon_file) if settings.lexicon_file else None
        # the deployment's and each client's (a fleet's, through its Redis)
        self.lexicons = Lexicons(deployment, runtime.store)
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
        self.llm = llm_kind(settings.llm)  # a prompt's source: refused at start if unknown
        self.supplies = Supplies(
            settings,
            runtime.llm_client,  # never the model servers' (their key is theirs)
            lambda: runtime.bedrock,  # made as the runtime starts
            runtime.retry,
            on_retry=self._llm_retried,
            on_stop=self._llm_stopped,
        )

    def source_for(
        self,
        params: SpeakParams,
        history: Sequence[dict[str, str]] = (),
        *,
        client_text: bool = False,
    ) -> Source:
        """The text source a request asks for (`gateway.sources.registry.kind_for`): its text,
        its prompt through `--llm`'s source, or, with neither, the client's own text where the
        caller can take it (`client_text`: the WebSocket). Raises `BadRequest`:
        `echo_pacing_disabled` (pacing asked of a gateway beyond loopback without
        `--echo-pacing`), `text_too_long`/`empty_text`, `reply_too_long` (text given whole
        that would speak longer than `--max-reply-audio-s`), `missing_text` (neither text nor
        prompt, and the caller cannot take the client's)."""
        settings = self.settings
        if (params.echo_tps or params.echo_first_ms) and not self.echo_pacing:
            raise BadRequest(
                "echo_tps and echo_first_ms (the echo source's pacing) are for demos and "
                "benchmarks: this gateway does not honour them",
                code="echo_pacing_disabled",
            )
        said = ""
        if params.text is not None:
            said = limits.check_text(params.text, settings.max_text_chars, "text")
        elif params.prompt is not None:
            said = limits.check_text(params.prompt, settings.max_text_chars, "prompt")
        kind = kind_for(
            text=params.text is not None, prompt=params.prompt is not None, llm=self.llm
        )
        if kind.capabilities.takes_client_text and not client_text:
            raise BadRequest("give 'text' or 'prompt'", code="missing_text")
        if kind.capabilities.speaks_given_text:
            self._check_spoken(self._marked(said, params.markup), params.speed)
        request = SourceRequest(said, history, params.echo_tps, params.echo_first_ms)
        return kind.build(request, self.supplies)

    @property
    def echo_pacing(self) -> bool:
        """Whether the echo source's pacing is honoured: on a loopback listener, or with
        `--echo-pacing` (demos and benchmarks)."""
        return self.settings.echo_pacing or is_loopback(self.settings.host)

    def _marked(self, text: str, mode: str) -> tuple[markup.Item, ...]:
        """A given text's markup (`markup.parse`; no IPA check: the model server knows its
        phonemes). Raises `BadRequest`: `invalid_markup`, `invalid_ipa`, `pause_too_long`."""
        try:
            return markup.parse(text, mode, None, self.settings.max_pause_s)
        except InvalidRequest as exc:
            raise BadRequest(exc.message, code=exc.code) from None

    def _check_spoken(self, items: tuple[markup.Item, ...], speed: float) -> None:
        """Raises `BadRequest` (`reply_too_long`) for text that would speak longer than
        `--max-reply-audio-s` (estimated: `kokoro_contract.spoken`, and its pauses)."""
        limit = self.settings.max_reply_audio_s
        pauses = sum(item.seconds for item in items if isinstance(item, markup.Pause))
        estimate = spoken_s(markup.spoken_text(items), speed) + pauses
        if limit and estimate > limit:
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
        source: Source,
        out: asyncio.Queue[Event | None],
        tts: ResumingTransport,
        *,
        alone: bool = False,
        progressive: bool = False,
        on_end: Callable[[], None] | None = None,
        utterance_id: str | None = None,
        audio_format: AudioFormat | None = None,
        buffering: Buffering = Buffering.GATEWAY,
        lexicon: Lexicon | None = None,
    ) -> Reply:
        """A reply to `params` from `source`, its events into `out`, synthesized by `tts`;
        `alone` and `progressive` say what its model server is (nothing else to do; speaks
        progressively), `on_end` is called as it ends (before `agent_end`),
        `audio_format` overrides the browser format `params` name (the OpenAI route's), and
        `buffering` says who cuts a client's text (`Buffering.CLIENT`: its flushes)."""
        assert not isinstance(params.voice, list), "a blend's parts are resolved to its name"
        spec = ReplySpec(
            utterance_id=utterance_id or params.utterance_id or new_utterance_id(),
            mode=params.mode,
            format=audio_format or params.audio_format,
            voice=params.voice or self.settings.default_voice or None,
            speed=params.speed,
            options=TextOptions(params.language, params.normalize, params.markup, lexicon),
            # timings from the TTS when asked for, and for LLM answers: what a listener who
            # interrupts has heard is what the conversation keeps
            timestamps=params.timestamps or params.prompt is not None,
            words_events=params.timestamps,
        )
        self.metrics.replies.labels(spec.mode, spec.format.name).inc()
        plan: Plan
        if buffering is Buffering.CLIENT:
            plan = client_plan(self.plan.max_chars)
        elif self.settings.chunk_plan == "playback":
            if progressive:  # its first reply already planned for windows
                self.early.assume()
            plan = ChunkPlan(
                self.plan,
                self.speed,
                self.speech,
                spec.speed,
                first_speed=self.first_audio,
                early=self.early,
                alone=alone,
            )
        else:
            plan = SentencePlan(self.chunker)
        # the client writes at its own pace: no LLM stalls there
        stall = None if source.capabilities.takes_client_text else self.settings.llm_timeout_s
        return Reply(
            spec,
            source.text,
            create_encoder(spec.format),
            tts,
            tts,
            out,
            plan,
            max_s=self.settings.max_reply_s,
            text_stall_s=stall,
            on_end=on_end,
            max_audio_s=self.settings.max_reply_audio_s or None,
            stop_reason=source.stop_reason,
        )
