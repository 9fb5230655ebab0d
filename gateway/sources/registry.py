"""The text sources by name, each with what it can do: a reply's source is built through this
registry, and what the gateway needs to know of a source it reads from its declared
capabilities, never from its class or its name. `--llm`'s choices are the kinds that answer
prompts. A source's own module (and its imports: botocore, httpx) loads when it is built.

What a kind declares (`Capabilities`) is what the built source (`Source`) carries: a kind that
takes the client's text comes with the queue the client's deltas go into, one that says why
its answer ended with the reader of that reason, one that sends a prompt with its size
(`tests/gateway/sources/test_registry.py` checks each kind does what it declares)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.sources.base import TextSource

if TYPE_CHECKING:
    import httpx

    from gateway.config import Settings
    from gateway.retry import OnRetry, RetryPolicy
    from gateway.sources.client import ClientTextSource


@dataclass(frozen=True)
class Capabilities:
    answers_prompts: bool  # `--llm` may name it: it answers a request's prompt
    speaks_given_text: bool  # it speaks the request's own text, whole from the start
    takes_client_text: bool  # the client sends the text as it writes it (the WebSocket's)
    paced: bool  # echo_tps and echo_first_ms pace it like an LLM (demos, benchmarks)
    stop_reason: bool  # it says why its answer ended (`agent_end`'s stop_reason)
    sends_prompt: bool  # it sends a prompt upstream: its characters count as LLM tokens


@dataclass(frozen=True)
class SourceRequest:
    """What one reply asks of its source."""

    text: str = ""  # the text to speak, or the prompt to answer ("": the client sends it)
    history: Sequence[dict[str, str]] = ()  # the conversation before a prompt
    tps: float = 0.0  # a paced source's tokens per second (0: all at once)
    first_ms: float = 0.0  # and its wait before the first


@dataclass(frozen=True)
class Supplies:
    """What the gateway gives every source it builds: its settings, the LLM's own HTTP client
    (never the model servers': their key is theirs), the Bedrock client once the runtime has
    started, the retry policy, and the callbacks that count retries and stop reasons."""

    settings: Settings
    llm_client: httpx.AsyncClient
    bedrock: Callable[[], Any]
    retry: RetryPolicy
    on_retry: OnRetry | None = None
    on_stop: Callable[[str, dict[str, int]], None] | None = None


@dataclass(frozen=True)
class Source:
    """One reply's text source as built: its text, its kind, and what that kind's capabilities
    promise (the others stay at their defaults)."""

    kind: SourceKind
    text: TextSource
    prompt_chars: int = 0  # sends_prompt: what each request sends its LLM, in characters
    stop_reason: Callable[[], str | None] | None = None  # stop_reason: why it ended, once it has
    client_text: ClientTextSource | None = None  # takes_client_text: where the client's text goes

    @property
    def capabilities(self) -> Capabilities:
        return self.kind.capabilities


@dataclass(frozen=True)
class SourceKind:
    name: str
    capabilities: Capabilities
    make: Callable[[SourceKind, SourceRequest, Supplies], Source]

    def build(self, request: SourceRequest, supplies: Supplies) -> Source:
        """A source of this kind for one reply (nothing is opened before it is streamed)."""
        return self.make(self, request, supplies)


def _echo(kind: SourceKind, request: SourceRequest, _supplies: Supplies) -> Source:
    from gateway.sources.echo import EchoSource

    return Source(kind, EchoSource(request.text, request.tps, request.first_ms))


def _client(kind: SourceKind, _request: SourceRequest, _supplies: Supplies) -> Source:
    from gateway.sources.client import ClientTextSource

    queue = ClientTextSource()
    return Source(kind, queue, client_text=queue)


def _turns(request: SourceRequest) -> list[dict[str, str]]:
    return [*request.history, {"role": "user", "content": request.text}]


def _openai(kind: SourceKind, request: SourceRequest, supplies: Supplies) -> Source:
    from gateway.sources.openai_chat import OpenAIChatSource

    settings = supplies.settings
    messages = [{"role": "system", "content": settings.system_prompt}, *_turns(request)]
    source = OpenAIChatSource(
        supplies.llm_client,
        settings.openai_base_url,
        settings.openai_model,
        messages,
        settings.openai_api_key,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        retry=supplies.retry,
        first_token_budget_s=settings.first_audio_budget_s,
        on_retry=supplies.on_retry,
    )
    return Source(kind, source, prompt_chars=source.prompt_chars)


def _bedrock(kind: SourceKind, request: SourceRequest, supplies: Supplies) -> Source:
    from gateway.sources.bedrock import BedrockOptions, BedrockSource

    settings = supplies.settings
    options = BedrockOptions(
        settings.bedrock_model_id,
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        retry=supplies.retry,
        first_token_budget_s=settings.first_audio_budget_s,
        on_retry=supplies.on_retry,
        on_stop=supplies.on_stop,
    )
    source = BedrockSource(supplies.bedrock(), options, settings.system_prompt, _turns(request))
    return Source(
        kind, source, prompt_chars=source.prompt_chars, stop_reason=lambda: source.stop_reason
    )


SOURCES: dict[str, SourceKind] = {
    kind.name: kind
    for kind in (
        SourceKind(
            "echo",
            Capabilities(
                answers_prompts=True,  # `--llm echo` speaks the prompt itself
                speaks_given_text=True,
                takes_client_text=False,
                paced=True,
                stop_reason=False,
                sends_prompt=False,
            ),
            _echo,
        ),
        SourceKind(
            "openai",
            Capabilities(
                answers_prompts=True,
                speaks_given_text=False,
                takes_client_text=False,
                paced=False,
                stop_reason=False,
                sends_prompt=True,
            ),
            _openai,
        ),
        SourceKind(
            "bedrock",
            Capabilities(
                answers_prompts=True,
                speaks_given_text=False,
                takes_client_text=False,
                paced=False,
                stop_reason=True,  # messageStop's stopReason
                sends_prompt=True,
            ),
            _bedrock,
        ),
        SourceKind(
            "client",
            Capabilities(
                answers_prompts=False,
                speaks_given_text=False,
                takes_client_text=True,
                paced=False,
                stop_reason=False,
                sends_prompt=False,
            ),
            _client,
        ),
    )
}

# what `--llm` may name: the kinds that answer a prompt
LLMS = tuple(name for name, kind in SOURCES.items() if kind.capabilities.answers_prompts)


def source_kind(name: str) -> SourceKind:
    """The source named `name`; `ValueError` naming the others when there is none."""
    kind = SOURCES.get(name)
    if kind is None:
        raise ValueError(f"unknown text source {name!r}; one of {', '.join(SOURCES)}")
    return kind


def llm_kind(name: str) -> SourceKind:
    """The source `--llm` names; `ValueError` when there is none, or it answers no prompt."""
    kind = source_kind(name)
    if not kind.capabilities.answers_prompts:
        raise ValueError(
            f"text source {name!r} answers no prompt; --llm is one of {', '.join(LLMS)}"
        )
    return kind


def kind_for(*, text: bool, prompt: bool, llm: SourceKind) -> SourceKind:
    """Which source a request gets: its own text is spoken as it is (`echo`), a prompt is
    answered by `--llm`'s, and with neither the client sends its text as it writes it
    (`client`)."""
    if text:
        return SOURCES["echo"]
    if prompt:
        return llm
    return SOURCES["client"]
