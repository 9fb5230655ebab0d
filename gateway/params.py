"""Request fields at the HTTP/JSON boundary (pydantic), shared by SSE, WebSocket and OpenAI.

Limits come from `kokoro_contract.limits`, formats from `kokoro_contract.formats`."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from gateway.errors import BadRequest
from kokoro_contract import formats, languages, limits
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.formats import AudioFormat


class Mode(StrEnum):
    BIDI = "bidi"  # chunks synthesized while the text still streams in
    BATCH = "batch"  # all the text, then one synthesis call: the baseline


class Buffering(StrEnum):
    """Who decides when a context's streamed text goes to synthesis (the speak WebSocket's
    protocol 2)."""

    GATEWAY = "gateway"  # the chunk plan: sentences as soon as they can keep up; flushes too
    CLIENT = "client"  # the client: what came before each flush, as one chunk


Normalize = Literal["auto", "on", "off"]  # kokoro_contract.protocol.NORMALIZE
Markup = Literal["auto", "strict", "none"]  # kokoro_contract.markup.MARKUP


def _speed() -> Any:
    return Field(limits.DEFAULT_SPEED, ge=limits.MIN_SPEED, le=limits.MAX_SPEED)


def _no_bool(value: Any) -> Any:
    """A number field given `true` or `false` is refused, not read as 1 or 0 (pydantic's lax
    mode would); integers and numeric strings (query parameters) stay accepted."""
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


def _default_voice(value: Any) -> Any:
    """`voice: ""` means the default voice, as no voice does."""
    return None if value == "" else value


def _language(value: Any) -> str | None:
    """A language as the model server names it (`kokoro_contract.languages`: Kokoro's letter
    or an ISO name; none or "": the voice's); an unknown one is `unknown_language`, before
    anything is voiced."""
    try:
        return languages.check_language(value)
    except InvalidRequest as exc:
        raise PydanticCustomError(exc.code, exc.message) from None


# errors a field's validator names itself, reported under their own code (else invalid_field)
_OWN_CODES = frozenset({"unknown_language"})


class SpeakParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str | None = None
    prompt: str | None = None
    mode: Mode = Mode.BIDI
    format: str = "mp3"
    sample_rate: int | None = None  # pcm and wav: one of formats.PCM_RATES (None: 24000)
    voice: str | list[str] | None = None  # a voice, a blend ("a(2)+b(1)" or its parts), a name
    speed: float = _speed()
    language: str | None = None  # the text's (None: its voice's and script's)
    normalize: Normalize = "auto"  # numbers, addresses ... as words first (English)
    markup: Markup = "auto"  # [word](/IPA/), [pause:1s], SSML: read as markup or as text
    lexicon: str | None = None  # one of the client's lexicons (PUT /v1/lexicons/{name})
    echo_tps: float = Field(0.0, ge=0.0, le=1000.0)  # 0: unpaced; else at least 1 token/s
    echo_first_ms: float = Field(0.0, ge=0.0, le=10_000.0)
    timestamps: bool = False  # `words` events: word timings before the audio they describe
    utterance_id: str | None = Field(
        None,
        min_length=1,
        max_length=limits.MAX_UTTERANCE_ID_CHARS,
        pattern=limits.UTTERANCE_ID_PATTERN,
    )

    _numbers = field_validator("speed", "echo_tps", "echo_first_ms", "sample_rate", mode="before")(
        _no_bool
    )
    _voice = field_validator("voice", mode="before")(_default_voice)
    _language = field_validator("language", mode="before")(_language)

    @field_validator("format")
    @classmethod
    def _browser_format(cls, value: str) -> str:
        return formats.lookup(value, formats.BROWSER_FORMATS).name

    @field_validator("echo_tps")
    @classmethod
    def _pace(cls, value: float) -> float:
        if 0 < value < 1:  # a reply that would hold its session for hours
            raise ValueError("echo_tps is 0 (unpaced) or 1-1000 tokens per second")
        return value

    @model_validator(mode="after")
    def _one_input(self) -> SpeakParams:
        if self.text is not None and self.prompt is not None:
            raise ValueError("give either 'text' or 'prompt', not both")
        _at_rate(formats.FORMATS[self.format], self.sample_rate)
        return self

    @property
    def audio_format(self) -> AudioFormat:
        """The format asked for, at the sample rate asked for."""
        return formats.FORMATS[self.format].at(self.sample_rate)


def _at_rate(fmt: AudioFormat, rate: int | None) -> AudioFormat:
    """`fmt` at `rate` (`AudioFormat.at`), its refusal as a validation error."""
    try:
        return fmt.at(rate)
    except formats.UnknownFormat as exc:
        raise ValueError(str(exc)) from None


class CancelParams(BaseModel):
    """`POST /v1/speak/{utterance_id}/cancel` (and the WebSocket's cancel): how much of the
    utterance the listener heard."""

    model_config = ConfigDict(extra="forbid")

    played_ms: float | None = Field(None, ge=0.0, le=limits.MAX_PLAYED_MS)

    _numbers = field_validator("played_ms", mode="before")(_no_bool)


class OpenAISpeechParams(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = "kokoro"
    input: str = Field(min_length=1)
    voice: str | list[str] | None = "alloy"  # "": the gateway's default voice; or a blend
    response_format: str = "mp3"
    # not OpenAI's: pcm and wav at one of formats.PCM_RATES (None: 24000)
    sample_rate: int | None = None
    speed: float = _speed()
    stream_format: Literal["audio", "sse"] = "audio"
    instructions: str | None = None
    language: str | None = None  # not OpenAI's: the input's (None: its voice's and script's)
    normalize: Normalize = "auto"  # not OpenAI's: numbers, addresses ... as words first
    markup: Markup = "auto"  # not OpenAI's: [word](/IPA/), [pause:1s], SSML
    lexicon: str | None = None  # not OpenAI's: one of the client's lexicons

    _numbers = field_validator("speed", "sample_rate", mode="before")(_no_bool)
    _voice = field_validator("voice", mode="before")(_default_voice)
    _language = field_validator("language", mode="before")(_language)

    @field_validator("response_format")
    @classmethod
    def _openai_format(cls, value: str) -> str:
        if value not in formats.OPENAI_FORMATS:
            raise ValueError(f"use one of {', '.join(formats.OPENAI_FORMATS)}")
        return value

    @model_validator(mode="after")
    def _rate(self) -> OpenAISpeechParams:
        _at_rate(formats.OPENAI_FORMATS[self.response_format], self.sample_rate)
        return self

    @property
    def audio_format(self) -> AudioFormat:
        """The format asked for, at the sample rate asked for."""
        return formats.OPENAI_FORMATS[self.response_format].at(self.sample_rate)


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
        kinds = {err["type"] for err in exc.errors()}
        code = kinds.pop() if len(kinds) == 1 and kinds <= _OWN_CODES else "invalid_field"
        raise BadRequest(_describe(exc), code=code) from exc
