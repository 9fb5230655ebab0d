"""The gateway's settings: one object, from flags or GATEWAY_* environment variables."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gateway.reply.plan.config import FIRST_SLACK_S
from gateway.sources.registry import LLMS
from kokoro_contract import connections, limits
from kokoro_contract.markup import DEFAULT_MAX_PAUSE_S
from kokoro_contract.settings import parse_dataclass

ENV_PREFIX = "GATEWAY_"


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    model_server_url: str = "http://127.0.0.1:8080"  # several: comma-separated
    model_server_key: str = ""  # the model servers' --api-key, sent as a Bearer credential
    llm: str = "echo"
    openai_base_url: str = "http://127.0.0.1:11434/v1"
    openai_model: str = "llama3.2"
    openai_api_key: str = ""
    bedrock_model_id: str = "anthropic.claude-3-haiku-20240307-v1:0"
    aws_region: str = ""  # empty: the AWS SDK's default chain (AWS_REGION, profile, ...)
    max_tokens: int = 512
    temperature: float = 0.5
    system_prompt: str = (
        "You are a friendly voice assistant. Answer in plain spoken sentences, "
        "without markdown, lists or emoji."
    )
    tts_transport: str = "model-server"
    sagemaker_endpoint: str = ""
    sagemaker_http2_endpoint_uri: str = (
        ""  # default https://runtime.sagemaker.REGION.amazonaws.com:8443
    )
    default_voice: str = ""  # empty: the model server's default
    openai_voices: str = ""  # OpenAI voice name=voice, over Kokoro's namesakes
    max_text_chars: int = limits.MAX_TEXT_CHARS
    max_pause_s: float = DEFAULT_MAX_PAUSE_S  # a markup pause longer: 400 pause_too_long
    lexicon_file: Path | None = None  # the deployment's pronunciation lexicon (JSON)
    api_keys_file: str = ""  # one key per line, `name:key` or a bare key
    api_keys: str = ""  # the same, comma-separated (GATEWAY_API_KEYS)
    allow_anonymous: bool = False  # serve without keys beyond loopback
    token_ttl_s: int = 900
    allowed_origins: str = ""  # comma-separated; same-origin always allowed
    allowed_hosts: str = ""  # comma-separated Host names, or "*"; empty: loopback names only
    max_body_bytes: int = 65_536
    max_lexicon_bytes: int = 1_048_576  # PUT /v1/lexicons/{name}'s body
    max_message_bytes: int = 65_536
    max_sessions: int = 256
    max_sessions_per_client: int = 8
    max_sessions_per_subject: int = 2  # per token subject (a page's visitor); 0: no limit
    replies_per_minute: int = 60  # per client; 0: no limit
    replies_per_minute_per_subject: int = 20  # per token subject; 0: no limit
    llm_tokens_per_minute: int = 20_000  # per client; 0: no limit
    idle_timeout_s: float = 60.0
    max_connection_age_s: float = 3600.0  # a WebSocket's longest life; 0: no limit
    max_contexts_per_socket: int = 5  # protocol 2: contexts open at once on one WebSocket
    context_idle_s: float = 20.0  # protocol 2: a context waiting for text this long is closed
    max_reply_s: float = 300.0
    max_reply_audio_s: float = 180.0  # a reply's speech, estimated from its text: reply_too_long
    send_timeout_s: float = 10.0
    max_history_chars: int = 8_000
    tts_timeout_s: float = 15.0  # silence past a chunk's due time: tts_timeout
    stall_timeout_s: float = 2.0  # a model server's pong this late: tts_stalled (0: no pings)
    llm_timeout_s: float = 30.0  # an LLM silent this long mid-answer: llm_timeout
    retry_attempts: int = 4  # tries per hop before first audio, the first included
    drain_timeout_s: float = 25.0  # on SIGTERM: replies in progress finish within this
    internal_host: str = "127.0.0.1"
    internal_port: int = 9101  # /metrics and detailed readiness; 0: none
    public_openapi: bool = False  # /openapi.json and /docs on the public listener too
    header_timeout_s: float = connections.HEADER_TIMEOUT_S  # a request head: 408, closed
    body_timeout_s: float = connections.BODY_TIMEOUT_S  # a request body: 408 body_timeout
    keepalive_timeout_s: float = connections.KEEPALIVE_TIMEOUT_S  # idle between requests
    chunk_plan: str = "playback"  # playback: chunks sized to the listener's buffer; sentences
    first_min_words: int = 4
    first_max_words: int = 5
    first_wait_words: int = 16
    first_hold_s: float = 1.0  # playback: the first audio waits for what follows, at most
    first_slack_s: float = FIRST_SLACK_S  # a new reply's first chunk may wait, under load
    queue_size: int = 64  # events buffered per reply before the producers wait
    admission: bool = True  # refuse a reply whose first audio would miss the budget
    first_audio_budget_s: float = 3.0
    admission_wait_s: float = 0.5  # a new reply may wait this long for spare time, at most
    admission_waiting_per_client: int = 1  # of those waiting, one client's at most; 0: no limit
    echo_pacing: bool = False  # echo_tps/echo_first_ms beyond loopback (demos, benchmarks)
    redis_url: str = ""  # a fleet's shared store; empty: this gateway counts alone
    redis_required: bool = False  # with --redis-url: refuse new sessions while it is down
    redis_prefix: str = "kokoro-gateway"
    redis_timeout_s: float = 0.25
    fleet_lease_ttl_s: float = 15.0
    max_fleet_sessions: int = 0  # sessions open at once across the fleet; 0: no limit
    log_level: str = "info"

    @property
    def origins(self) -> list[str]:
        return _items(self.allowed_origins, lambda o: o.rstrip("/"))

    @property
    def hosts(self) -> list[str]:
        return _items(self.allowed_hosts, str.lower)


def _items(value: str, clean: Callable[[str], str]) -> list[str]:
    return [clean(item.strip()) for item in value.split(",") if item.strip()]


_HELP = {
    "host": "interface to listen on",
    "port": "port to listen on",
    "model_server_key": "the model servers' shared key (their --api-key), sent on every call",
    "model_server_url": "the Kokoro model server(s): http://host:port, comma-separated for "
    "several; a name that resolves to several addresses counts as several",
    "llm": "text source for prompts: echo speaks the text itself; openai streams a chat model",
    "openai_base_url": "an OpenAI-compatible API (vLLM, Ollama, llama.cpp server)",
    "openai_model": "chat model name for --llm openai",
    "openai_api_key": "API key for --llm openai (if the server needs one)",
    "bedrock_model_id": "Bedrock model for --llm bedrock (ConverseStream)",
    "aws_region": "AWS region (empty: the SDK's default chain)",
    "max_tokens": "LLM answer length limit, sent to every LLM (max_tokens, Bedrock maxTokens)",
    "temperature": "LLM sampling temperature",
    "system_prompt": "system prompt for the LLM",
    "tts_transport": "model-server (WebSocket + POST) or sagemaker (bidi + response stream)",
    "sagemaker_endpoint": "SageMaker endpoint running the model server (--tts-transport sagemaker)",
    "sagemaker_http2_endpoint_uri": "override for the HTTP/2 bidi client (default: region's :8443)",
    "default_voice": "voice when a request names none (empty: the model server's default)",
    "openai_voices": "OpenAI voice names (alloy, ash, ballad, cedar, coral, echo, fable, marin, "
    "nova, onyx, sage, shimmer, verse) mapped to voices, comma-separated name=voice, over "
    "Kokoro's namesakes (alloy=af_alloy, echo=am_echo, fable=bm_fable, nova=af_nova, "
    "onyx=am_onyx); one whose voice is not loaded speaks with the default voice",
    "max_text_chars": "longest text or prompt accepted",
    "lexicon_file": "a JSON object of word -> IPA between slashes ('/kˈOkəɹO/') or alias text, "
    "read on every reply (a request's own lexicon's entries go on top); checked at start",
    "max_pause_s": "longest pause a given text's markup may ask for ([pause:1.5s], SSML <break "
    "time>): a longer one is 400 pause_too_long before any audio (the model servers' "
    "--max-pause-s checks an LLM's text as it comes: set both)",
    "api_keys_file": "file of API keys, one per line: name:key, or a bare key; with keys, "
    "every /v1 route needs 'Authorization: Bearer <key>' or a token from POST /v1/tokens",
    "api_keys": "API keys, comma-separated name:key or bare keys (use the environment: flags "
    "show in ps)",
    "allow_anonymous": "serve without API keys while listening beyond loopback (without keys "
    "and this, a gateway that listens beyond loopback refuses to start)",
    "token_ttl_s": "lifetime of tokens minted by POST /v1/tokens (at most 3600 s)",
    "allowed_origins": "browser origins allowed besides the gateway's own page (CORS, Origin "
    "of every /v1 route and the WebSocket); localhost origins too while listening on loopback",
    "allowed_hosts": "Host header names served, comma-separated; '*': any (empty: loopback names, "
    "and beyond loopback the gateway refuses to start)",
    "max_body_bytes": "largest request body (413 body_too_large)",
    "max_lexicon_bytes": "largest lexicon a PUT /v1/lexicons/{name} may send (413 "
    "body_too_large): 1 MiB holds about 30,000 short entries; a lexicon has at most 10,000",
    "max_message_bytes": "largest WebSocket message (larger: closed with 1009)",
    "max_sessions": "sessions open at once (WebSockets and HTTP replies; 503 overloaded)",
    "max_sessions_per_client": "sessions open at once per API key, or per address when "
    "anonymous (429 too_many_sessions)",
    "max_sessions_per_subject": "sessions open at once per token subject (the visitor a page's "
    "backend named when it minted the token), within its key's (429 too_many_sessions; 0: no "
    "limit)",
    "replies_per_minute": "replies per minute per client (429 rate_limited; 0: no limit)",
    "replies_per_minute_per_subject": "replies per minute per token subject, within its key's "
    "(429 rate_limited; 0: no limit)",
    "llm_tokens_per_minute": "LLM tokens per minute per client, what a reply sends (system "
    "prompt, history, prompt) and its answer, 4 characters each (429 rate_limited; 0: no limit)",
    "idle_timeout_s": "a WebSocket with no reply playing and no well-formed message for this "
    "long is closed",
    "max_connection_age_s": "a WebSocket open this long is closed (1008 max_connection_age) once "
    "no reply is playing, whatever its credentials; one opened with a token closes when the "
    "token expires (1008 token_expired) (0: no age limit)",
    "max_contexts_per_socket": "contexts open at once on one speak WebSocket in protocol 2 (a "
    "speak past it: too_many_contexts)",
    "context_idle_s": "a protocol 2 context that waits for the client's text, with no message "
    "naming it and nothing to synthesize, for this long is closed (context_closed, reason idle)",
    "max_reply_s": "longest reply; a longer one ends with error reply_too_long",
    "max_reply_audio_s": "longest speech of one reply, estimated from its text with digits and "
    "symbols read out: text given whole that would speak longer is refused (400 "
    "reply_too_long), streamed text stops there with error reply_too_long (0: no limit)",
    "send_timeout_s": "a client that takes longer than this to take one message is dropped",
    "max_history_chars": "conversation history kept per WebSocket, and per AgentCore session "
    "and caller, for LLM prompts (oldest turns dropped first)",
    "stall_timeout_s": "the model server's WebSocket is pinged every half of this; a pong this "
    "late (a frozen process, a cut network) fails the session at once, whatever audio the "
    "listener has buffered: the reply resumes on another model server, or ends with a "
    "retryable error (0: no pings)",
    "tts_timeout_s": "a reply's TTS stream silent this long past a chunk's due time (its "
    "deadline, or when it was sent) fails with tts_timeout, and its model server gets no new "
    "replies for a while",
    "llm_timeout_s": "an LLM that sends nothing for this long, before or during its answer, "
    "fails the reply with llm_timeout",
    "retry_attempts": "tries per hop (model server, SageMaker, Bedrock, OpenAI-compatible) for "
    "a retryable failure before the reply's first audio, within --first-audio-budget-s; 1: none",
    "drain_timeout_s": "on SIGTERM: stop accepting, let replies in progress finish for up to "
    "this long, then close WebSockets with 1012 (service restart)",
    "internal_host": "interface of the internal listener (/metrics, detailed /readyz)",
    "internal_port": "port of the internal listener (0: none)",
    "public_openapi": "serve /openapi.json and /docs on the public listener too (always on the "
    "internal one)",
    "header_timeout_s": "a connection whose request line and headers take longer than this "
    "(from its opening, or from its next request's first byte) gets 408 and is closed",
    "body_timeout_s": "a request body not complete this long after its headers gets 408 "
    "body_timeout and the connection is closed",
    "keepalive_timeout_s": "an idle kept-alive connection is closed after this long",
    "chunk_plan": "playback: the first chunk early, later chunks as large as the listener's "
    "buffer allows, each with a deadline; sentences: every sentence as it is final (the plan "
    "before deadlines)",
    "first_min_words": "words before the first clause may be released",
    "first_max_words": "words after which the first chunk is released without punctuation "
    "(playback: cut only where a phrase begins)",
    "first_wait_words": "playback: the first chunk is cut here at the latest",
    "first_hold_s": "playback: the first audio waits, at most this long after it is ready, "
    "until the chunk after it can be ready before it runs out (0: it goes at once)",
    "first_slack_s": "playback: a new reply's first chunk, while its model server has other "
    "work, is needed this long after it could be ready, so replies in progress are not made "
    "late; admission counts a reply not started yet as having this much spare time (0: none)",
    "queue_size": "events buffered per reply",
    "admission": "refuse a new reply (503 overloaded, retryable) when no model server can give "
    "it first audio within the budget without making replies in progress late",
    "first_audio_budget_s": "admission: longest acceptable wait for a reply's first audio",
    "admission_wait_s": "admission: a new reply that no model server can take now, because "
    "replies in progress need their spare time, waits up to this long (within the budget) "
    "for one that can before it is refused (0: refused at once)",
    "admission_waiting_per_client": "admission: of the new replies waiting for spare time, at "
    "most this many of one client's (its key, or a token's visitor); one more is refused at "
    "once, so the spare time that frees goes to the clients in turn (0: no limit)",
    "echo_pacing": "honour the echo source's pacing (echo_tps, echo_first_ms: a reply that "
    "speaks its text as slowly as an LLM would) while listening beyond loopback, for demos and "
    "benchmarks; without it such a request gets 400 echo_pacing_disabled there (on loopback "
    "pacing is always honoured)",
    "redis_url": "Redis shared by a fleet of gateways (redis://[:password@]host:port/db, "
    "rediss:// for TLS; use GATEWAY_REDIS_URL: flags show in ps): sessions open, replies and "
    "LLM tokens per minute are counted across every gateway that names it; empty: each "
    "gateway counts alone. While it does not answer, each gateway counts alone and its "
    "internal /readyz says degraded",
    "redis_required": "with --redis-url: while Redis does not answer, refuse new sessions and "
    "replies (503 fleet_unavailable) and report not ready, rather than count alone",
    "redis_prefix": "prefix of this fleet's keys in Redis (fleets sharing one Redis need their "
    "own)",
    "redis_timeout_s": "longest wait for one Redis call; past it the store counts as down",
    "fleet_lease_ttl_s": "a gateway that stops renewing its sessions in Redis (it died) has "
    "them released this long after its last renewal (renewed every third of it)",
    "max_fleet_sessions": "sessions open at once across every gateway sharing --redis-url (503 "
    "overloaded; 0: no limit; --max-sessions still caps each gateway)",
    "log_level": "logging level",
}


def parse_settings(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: object,
) -> Settings:
    return parse_dataclass(
        Settings,
        prog="gateway",
        description="Streamed LLM text to Kokoro speech for browsers (SSE and WebSocket)",
        env_prefix=ENV_PREFIX,
        help=_HELP,
        choices={
            "llm": list(LLMS),
            "tts_transport": ["model-server", "sagemaker"],
            "chunk_plan": ["playback", "sentences"],
        },
        argv=argv,
        env=env,
        overrides=overrides,
    )
