"""The gateway's settings: one object, from flags or GATEWAY_* environment variables."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kokoro_contract import limits
from kokoro_contract.settings import parse_dataclass

ENV_PREFIX = "GATEWAY_"


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    model_server_url: str = "http://127.0.0.1:8080"  # several: comma-separated
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
    max_text_chars: int = limits.MAX_TEXT_CHARS
    allowed_origins: str = ""  # comma-separated; localhost and same-origin always allowed
    chunk_plan: str = "playback"  # playback: chunks sized to the listener's buffer; sentences
    first_min_words: int = 4
    first_max_words: int = 8
    first_wait_words: int = 16
    queue_size: int = 64  # events buffered per reply before the producers wait
    admission: bool = True  # refuse a reply whose first audio would miss the budget
    first_audio_budget_s: float = 3.0
    log_level: str = "info"

    @property
    def origins(self) -> list[str]:
        return [o.strip().rstrip("/") for o in self.allowed_origins.split(",") if o.strip()]


_HELP = {
    "host": "interface to listen on",
    "port": "port to listen on",
    "model_server_url": "the Kokoro model server(s): http://host:port, comma-separated for "
    "several; a name that resolves to several addresses counts as several",
    "llm": "text source for prompts: echo speaks the text itself; openai streams a chat model",
    "openai_base_url": "an OpenAI-compatible API (vLLM, Ollama, llama.cpp server)",
    "openai_model": "chat model name for --llm openai",
    "openai_api_key": "API key for --llm openai (if the server needs one)",
    "bedrock_model_id": "Bedrock model for --llm bedrock (ConverseStream)",
    "aws_region": "AWS region (empty: the SDK's default chain)",
    "max_tokens": "LLM answer length limit (Bedrock inferenceConfig.maxTokens)",
    "temperature": "LLM sampling temperature (Bedrock)",
    "system_prompt": "system prompt for the LLM",
    "tts_transport": "model-server (WebSocket + POST) or sagemaker (bidi + response stream)",
    "sagemaker_endpoint": "SageMaker endpoint running the model server (--tts-transport sagemaker)",
    "sagemaker_http2_endpoint_uri": "override for the HTTP/2 bidi client (default: region's :8443)",
    "default_voice": "voice when a request names none (empty: the model server's default)",
    "max_text_chars": "longest text or prompt accepted",
    "allowed_origins": "extra browser origins allowed (CORS and WebSocket Origin)",
    "chunk_plan": "playback: the first chunk early, later chunks as large as the listener's "
    "buffer allows, each with a deadline; sentences: every sentence as it is final (the plan "
    "before deadlines)",
    "first_min_words": "words before the first clause may be released",
    "first_max_words": "words after which the first chunk is released without punctuation "
    "(playback: cut only where a phrase begins)",
    "first_wait_words": "playback: the first chunk is cut here at the latest",
    "queue_size": "events buffered per reply",
    "admission": "refuse a new reply (503 overloaded, retryable) when no model server can give "
    "it first audio within the budget without making replies in progress late",
    "first_audio_budget_s": "admission: longest acceptable wait for a reply's first audio",
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
            "llm": ["echo", "openai", "bedrock"],
            "tts_transport": ["model-server", "sagemaker"],
            "chunk_plan": ["playback", "sentences"],
        },
        argv=argv,
        env=env,
        overrides=overrides,
    )
