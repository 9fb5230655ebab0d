"""Request fields at the HTTP/JSON boundary (pydantic), shared by SSE, WebSocket and OpenAI."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from gateway.errors import BadRequest

BROWSER_FORMATS = ("pcm", "wav", "mp3", "aac", "opus")


class SpeakParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    prompt: str | None = None
    mode: Literal["bidi", "batch"] = "bidi"
    format: Literal["pcm", "wav", "mp3", "aac", "opus"] = "mp3"
    voice: str | None = None
    speed: float = Field(1.0, ge=0.5, le=2.0)
    echo_tps: float = Field(0.0, ge=0.0, le=1000.0)
    echo_first_ms: float = Field(0.0, ge=0.0, le=60_000.0)
    utterance_id: str | None = Field(None, min_length=1, max_length=64, pattern=r"^[\w.:-]+$")

    @model_validator(mode="after")
    def _one_input(self) -> SpeakParams:
        if self.text is not None and self.prompt is not None:
            raise ValueError("give either 'text' or 'prompt', not both")
        return self


class OpenAISpeechParams(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = "kokoro"
    input: str = Field(min_length=1)
    voice: str = "alloy"
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.5, le=2.0)
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = None


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "request"
        parts.append(f"{where}: {err['msg']}")
    return "; ".join(parts)


def parse[M: BaseModel](model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest(_describe(exc), code="invalid_field") from exc
