"""The bidirectional wire contract (`/invocations-bidirectional-stream`), pure, for both sides:
the model server parses client messages and builds server messages; the gateway (and
`model-server-check`) builds client messages and parses server messages.

client -> server, one JSON object per message, in a text *or binary* frame (SageMaker delivers
every client message as a binary frame unless the caller asked for UTF-8):

    {"text": "...", "voice"?: "...", "speed"?: 1.0, "request_id"?: "...",
     "deadline_ms"?: 800, "timestamps"?: true, "language"?: "es",
     "normalize"?: "auto"|"on"|"off", "markup"?: "auto"|"strict"|"none",
     "lexicon"?: {"word": "/IPA/" or "alias text", ...}}                     synthesize
    {"type": "cancel", "request_id"?: "..."}                                 drop one (or all)
    {"type": "close"}                                                        end the session

server -> client: JSON control in text frames, audio in binary frames (s16le, 24 kHz, mono):

    {"type": "synthesis_start", "request_id"}
    {"type": "word_timings", "request_id", "words": [{"word", "start_s", "end_s"}]}
                                    (with "timestamps": before each segment's audio)
    <binary PCM>...
    {"type": "synthesis_complete", "request_id", "total_duration_s", "elapsed_s", "audio_bytes"}
    {"type": "synthesis_cancelled", "request_id"}
    {"type": "error", "request_id"?, "code", "message"}

A reader that sees frames without their types (SageMaker's PayloadParts) tells them apart with
the frame rule (`read_server_frame`): a frame that parses entirely as a JSON object with a
string `type` is control, anything else is audio. A first-byte check is wrong because PCM can
start with 0x7B (`{`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from kokoro_contract import languages, limits, markup
from kokoro_contract.audio import pcm_duration_s
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.lexicon import MAX_REQUEST_ENTRIES, Lexicon, check_entries

PATH = "/invocations-bidirectional-stream"


def _dump(obj: Mapping[str, Any]) -> str:
    return orjson.dumps(obj).decode()


# --- client -> server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestRules:
    """What a synthesis request may ask for on this server; defaults are filled in from here."""

    voices: frozenset[str]
    default_voice: str
    max_text_chars: int = limits.MAX_TEXT_CHARS


@dataclass(frozen=True)
class SynthesisRequest:
    text: str
    voice: str
    speed: float
    request_id: str
    # milliseconds from arrival by which the first audio is needed; None: as soon as possible.
    # A request that names one was sized by its sender and is synthesized in as few segments
    # as the model takes.
    deadline_ms: float | None = None
    timestamps: bool = False  # word timings before each segment's audio
    # the language to read `text` in (`languages.BY_NAME`); None: as its voice and script say
    language: str | None = None
    normalize: str = "auto"  # NORMALIZE: whether numbers, addresses ... are read as words first
    markup: str = "auto"  # markup.MARKUP: which constructs of `text` are read as markup
    # word -> "/IPA/" or alias text (`kokoro_contract.lexicon`), applied before G2P
    lexicon: Mapping[str, str] = field(default_factory=dict)


# how a request's text is normalised before G2P: "auto" as its language does (English: numbers,
# money, addresses ... as words; the other languages by their readers' own rules), "on" the
# same, "off" English read as written
NORMALIZE = ("auto", "on", "off")


def check_normalize(value: object) -> str:
    return limits.check_choice(value, "normalize", NORMALIZE)


@dataclass(frozen=True)
class TextOptions:
    """How a client asks for its text to be read, beyond voice and speed: what the gateway
    passes on with every chunk of a reply."""

    language: str | None = None  # `languages.check_language`'s name; None: the voice's
    normalize: str = "auto"  # one of NORMALIZE
    markup: str = "auto"  # one of markup.MARKUP
    lexicon: Lexicon | None = None  # the reply's (one version from start to end)

    def fields(self, text: str) -> dict[str, Any]:
        """The fields a synthesis message or body for `text` carries: only what differs from
        the defaults, so a request with none is the same bytes as before they existed; of the
        lexicon, the entries `text` uses."""
        fields: dict[str, Any] = {}
        if self.lexicon is not None and (used := self.lexicon.used(text)):
            fields["lexicon"] = used
        if self.language:
            fields["language"] = self.language
        if self.normalize != "auto":
            fields["normalize"] = self.normalize
        if self.markup != "auto":
            fields["markup"] = self.markup
        return fields


@dataclass(frozen=True)
class Cancel:
    """Cancel one request, or every pending request of the session when `request_id` is None."""

    request_id: str | None


@dataclass(frozen=True)
class Close:
    pass


@dataclass(frozen=True)
class ProtocolError:
    """A message the server cannot act on; answered with an error frame, the session stays."""

    code: str
    message: str
    request_id: str | None = None

    def encode(self) -> str:
        return ErrorMsg(self.code, self.message, self.request_id).encode()


ClientMessage = SynthesisRequest | Cancel | Close | ProtocolError


def new_request_id() -> str:
    return uuid.uuid4().hex


def decode_frame(data: str | bytes) -> dict[str, Any] | ProtocolError:
    """Decode one client message (text or binary frame, or a POST body) into a JSON object."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return ProtocolError(
                "invalid_utf8", f"binary frame is not UTF-8 text (byte {exc.start})"
            )
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return ProtocolError("invalid_json", f"message is not valid JSON: {exc}")
    if not isinstance(obj, dict):
        return ProtocolError(
            "not_an_object", f"message must be a JSON object, got {type(obj).__name__}"
        )
    return obj


def parse_client_message(data: str | bytes, rules: RequestRules) -> ClientMessage:
    obj = decode_frame(data)
    if isinstance(obj, ProtocolError):
        return obj
    rid = obj.get("request_id")
    request_id = rid if isinstance(rid, str) and rid else None
    kind = obj.get("type", "synthesize")
    if kind == "close":
        return Close()
    if kind == "cancel":
        if rid is not None and request_id is None:
            return ProtocolError("invalid_field", "request_id must be a non-empty string")
        return Cancel(request_id)
    if kind == "synthesize":
        return validate_synthesis(obj, rules)
    return ProtocolError(
        "unknown_type",
        f"unknown message type {kind!r}; expected synthesize, cancel or close",
        request_id,
    )


def validate_synthesis(
    obj: Mapping[str, Any], rules: RequestRules
) -> SynthesisRequest | ProtocolError:
    """Check one synthesis request (WebSocket message or POST body) and fill in defaults."""
    try:
        request_id = limits.check_request_id(obj.get("request_id")) or new_request_id()
    except InvalidRequest as exc:
        return ProtocolError(exc.code, exc.message)
    try:
        language = languages.check_language(obj.get("language"))
        # no voice asked: one that speaks the language, when one is loaded
        default = languages.voice_for(language, rules.voices, rules.default_voice)
        return SynthesisRequest(
            text=limits.check_text(obj.get("text"), rules.max_text_chars),
            voice=limits.check_voice(obj.get("voice"), rules.voices, default),
            speed=limits.check_speed(obj.get("speed")),
            request_id=request_id,
            deadline_ms=limits.check_deadline_ms(obj.get("deadline_ms")),
            timestamps=limits.check_flag(obj.get("timestamps"), "timestamps"),
            language=language,
            normalize=check_normalize(obj.get("normalize")),
            markup=markup.check_markup(obj.get("markup")),
            lexicon=_lexicon(obj.get("lexicon")),
        )
    except InvalidRequest as exc:
        return ProtocolError(exc.code, exc.message, request_id)


def _lexicon(obj: object) -> dict[str, str]:
    if obj is None:
        return {}
    return check_entries(obj, MAX_REQUEST_ENTRIES)


def synthesize_message(
    text: str,
    request_id: str,
    voice: str | None = None,
    speed: float | None = None,
    deadline_ms: float | None = None,
    timestamps: bool = False,
    options: TextOptions | None = None,
) -> str:
    """A client's synthesis request; without voice, speed or text options the server's
    defaults apply."""
    message: dict[str, Any] = {"text": text, "request_id": request_id}
    if timestamps:
        message["timestamps"] = True
    if options is not None:
        message.update(options.fields(text))
    if voice:
        message["voice"] = voice
    if speed is not None:
        message["speed"] = speed
    if deadline_ms is not None:
        message["deadline_ms"] = round(deadline_ms, 1)
    return _dump(message)


def cancel_message(request_id: str | None = None) -> str:
    return _dump(
        {"type": "cancel"} if request_id is None else {"type": "cancel", "request_id": request_id}
    )


def close_message() -> str:
    return _dump({"type": "close"})


def invocation_body(
    text: str,
    voice: str | None,
    speed: float,
    timestamps: bool = False,
    options: TextOptions | None = None,
) -> dict[str, Any]:
    """A `POST /invocations` body asking for streamed PCM (what both batch transports send);
    with `timestamps`, one JSON answer instead: base64 PCM beside its word timings."""
    body: dict[str, Any] = {"text": text, "speed": speed, "format": "pcm", "stream": True}
    if timestamps:
        body.update(stream=False, timestamps=True)
    if options is not None:
        body.update(options.fields(text))
    if voice:
        body["voice"] = voice
    return body


# --- server -> client ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StartMsg:
    request_id: str

    def encode(self) -> str:
        return _dump({"type": "synthesis_start", "request_id": self.request_id})


@dataclass(frozen=True)
class CompleteMsg:
    request_id: str
    audio_bytes: int
    elapsed_s: float

    @property
    def total_duration_s(self) -> float:
        return round(pcm_duration_s(self.audio_bytes), 4)

    def encode(self) -> str:
        return _dump(
            {
                "type": "synthesis_complete",
                "request_id": self.request_id,
                "total_duration_s": self.total_duration_s,
                "elapsed_s": round(self.elapsed_s, 4),
                "audio_bytes": self.audio_bytes,
            }
        )


@dataclass(frozen=True)
class CancelledMsg:
    request_id: str

    def encode(self) -> str:
        return _dump({"type": "synthesis_cancelled", "request_id": self.request_id})


@dataclass(frozen=True)
class ErrorMsg:
    code: str
    message: str
    request_id: str | None = None

    def encode(self) -> str:
        event: dict[str, Any] = {"type": "error"}
        if self.request_id is not None:
            event["request_id"] = self.request_id
        event["code"] = self.code
        event["message"] = self.message
        return _dump(event)


@dataclass(frozen=True)
class WordTiming:
    """One word as its text spelled it, and when it is heard: seconds from the first audio
    sample of its request (model server) or milliseconds from the utterance's (gateway)."""

    word: str
    start: float
    end: float


@dataclass(frozen=True)
class WordTimingsMsg:
    request_id: str
    words: tuple[WordTiming, ...]

    def encode(self) -> str:
        words = [
            {"word": w.word, "start_s": round(w.start, 3), "end_s": round(w.end, 3)}
            for w in self.words
        ]
        return _dump({"type": "word_timings", "request_id": self.request_id, "words": words})


def parse_words(
    items: object, start_key: str = "start_s", end_key: str = "end_s"
) -> tuple[WordTiming, ...]:
    """Word timings from JSON (`word_timings` frames, JSON answers); malformed entries are
    dropped, not fatal: timings are an aid, never the audio itself."""
    if not isinstance(items, list):
        return ()
    words = []
    for item in items:
        if not isinstance(item, dict):
            continue
        word, start, end = item.get("word"), item.get(start_key), item.get(end_key)
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (start, end))
        if isinstance(word, str) and numbers:
            words.append(WordTiming(word, float(start), float(end)))  # type: ignore[arg-type]
    return tuple(words)


@dataclass(frozen=True)
class UnknownMsg:
    """A control message of a type this side does not know (newer server): ignored."""

    type: str
    body: dict[str, Any]


ServerMessage = StartMsg | CompleteMsg | CancelledMsg | ErrorMsg | WordTimingsMsg | UnknownMsg


def parse_control(frame: bytes | str) -> dict[str, Any] | None:
    """The frame rule for untyped streams: a JSON object is control, anything else is audio."""
    if isinstance(frame, str):
        frame = frame.encode()
    if not frame or frame[:1] not in (b"{", b" ", b"\t", b"\r", b"\n"):
        return None
    try:
        obj = orjson.loads(frame)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("type"), str) else None


def _str(obj: Mapping[str, Any], key: str, default: str = "") -> str:
    value = obj.get(key)
    return value if isinstance(value, str) else default


def read_server_frame(frame: bytes | str) -> ServerMessage | bytes:
    """One frame from the server: a typed control message, or audio bytes (the frame rule)."""
    obj = parse_control(frame)
    if obj is None:
        return frame if isinstance(frame, bytes) else frame.encode()
    kind = obj["type"]
    rid = _str(obj, "request_id")
    if kind == "synthesis_start":
        return StartMsg(rid)
    if kind == "synthesis_complete":
        audio = obj.get("audio_bytes")
        elapsed = obj.get("elapsed_s")
        return CompleteMsg(
            rid,
            audio if isinstance(audio, int) else 0,
            float(elapsed) if isinstance(elapsed, int | float) else 0.0,
        )
    if kind == "synthesis_cancelled":
        return CancelledMsg(rid)
    if kind == "word_timings":
        return WordTimingsMsg(rid, parse_words(obj.get("words")))
    if kind == "error":
        return ErrorMsg(_str(obj, "code", "error"), _str(obj, "message", "error"), rid or None)
    return UnknownMsg(kind, obj)
