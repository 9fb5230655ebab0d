"""`KokoroVoiceTTSService`: pipecat's TTS over the Kokoro voice gateway's speak WebSocket.

One long-lived WebSocket to `/v1/speak/ws`. Each pipecat context is one utterance: a `speak`
with no text (the client streams it), then the context's text as `text` deltas and a `flush`
when its turn ends. The gateway answers with binary frames (the utterance id, then 24 kHz mono
s16le PCM) and `words` frames (word timings on the utterance's clock), which become
`TTSAudioRawFrame`s and pipecat's word timestamps. An interruption sends `cancel` (with
`played_ms` when pipecat has played some of the context) and the next utterance waits for
`cancelled`; the gateway plays one utterance at a time, so contexts queue (`wire.py`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from loguru import logger
from pipecat.frames.frames import (
    ErrorFrame,
    Frame,
    TTSAudioRawFrame,
    TTSStoppedFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessorSetup
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TextAggregationMode, WebsocketTTSService
from pipecat.utils.errors import ErrorCategory
from pipecat.utils.types import NOT_GIVEN, NotGiven
from websockets.protocol import State

from pipecat_kokoro_voice.wire import Ended, Message, UtteranceQueue, Voice

SAMPLE_RATE = 24_000
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000

# gateway error codes and what kind of failure each is, for pipecat's ErrorCategory
_CATEGORIES = {
    "unauthorized": ErrorCategory.AUTHENTICATION,
    "token_not_for_route": ErrorCategory.AUTHORIZATION,
    "origin_not_allowed": ErrorCategory.AUTHORIZATION,
    "unknown_voice": ErrorCategory.INVALID_REQUEST,  # a setting: a new voice clears it
    "invalid_field": ErrorCategory.INVALID_REQUEST,
    "rate_limited": ErrorCategory.RATE_LIMIT,
    "too_many_sessions": ErrorCategory.RATE_LIMIT,
    "overloaded": ErrorCategory.SERVER,
    "tts_unavailable": ErrorCategory.CONNECTIVITY,
}


class KokoroVoiceError(Exception):
    """An error frame from the gateway: `code`, `message`, whether a retry may succeed."""

    def __init__(
        self,
        code: str,
        message: str,
        retryable: bool = False,
        utterance_id: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.retryable = retryable
        self.utterance_id = utterance_id
        self.retry_after_s = retry_after_s
        super().__init__(str(self))

    def __str__(self) -> str:
        retry = ""
        if self.retryable:
            after = f" after {self.retry_after_s:g} s" if self.retry_after_s else ""
            retry = f" (retryable{after})"
        return f"{self.code}: {self.message}{retry}"

    @classmethod
    def from_frame(cls, body: Message) -> KokoroVoiceError:
        after = body.get("retry_after_s")
        return cls(
            str(body.get("code", "error")),
            str(body.get("message", "")),
            bool(body.get("retryable", False)),
            body.get("utterance_id") if isinstance(body.get("utterance_id"), str) else None,
            float(after) if isinstance(after, int | float) else None,
        )

    @property
    def category(self) -> ErrorCategory:
        if self.code in _CATEGORIES:
            return _CATEGORIES[self.code]
        if self.code.startswith("tts_") or self.retryable:
            return ErrorCategory.SERVER
        return ErrorCategory.UNKNOWN


@dataclass
class KokoroVoiceTTSSettings(TTSSettings):
    """Settings of `KokoroVoiceTTSService` (runtime-updatable with `TTSUpdateSettingsFrame`;
    a change applies from the next utterance).

    Parameters:
        voice: a voice the gateway has (`GET /v1/voices`), or an OpenAI name it maps;
            None: the gateway's default voice.
        speed: 0.5-2.0.
    """

    speed: float | NotGiven | None = field(default_factory=lambda: NOT_GIVEN)


@dataclass
class _Playback:
    """How much of a context pipecat has pushed on, and when it started playing (the word
    timestamps' baseline, on pipecat's clock), for `played_ms` at a barge-in."""

    started_ns: int | None = None
    pushed_bytes: int = 0


class KokoroVoiceTTSService(WebsocketTTSService):
    """Speech from the Kokoro voice gateway, streamed as the text arrives, with word timestamps.

    Event handlers:
        on_utterance_cancelled(service, utterance_id, played_ms, heard_text): the gateway
            stopped an interrupted utterance; with `played_ms`, `heard_text` is what the
            listener heard of it (the words that ended by then, as the text spelled them).

    Args:
        url: the gateway's base URL (`http://`, `https://`, `ws://` or `wss://`) or the full
            `.../v1/speak/ws` address.
        api_key: an API key or a token from `POST /v1/tokens`, sent as
            `Authorization: Bearer`; None for a gateway without keys.
        settings: `KokoroVoiceTTSService.Settings(voice=..., speed=...)`.
        text_aggregation_mode: TOKEN by default: the gateway cuts the stream into chunks
            itself (its first clause early), so tokens go on as they come.
    """

    Settings = KokoroVoiceTTSSettings
    _settings: KokoroVoiceTTSSettings

    def __init__(
        self,
        *,
        url: str = "ws://127.0.0.1:8000",
        api_key: str | None = None,
        settings: KokoroVoiceTTSSettings | None = None,
        text_aggregation_mode: TextAggregationMode | None = TextAggregationMode.TOKEN,
        **kwargs: Any,
    ) -> None:
        defaults = KokoroVoiceTTSSettings(model=None, voice=None, language=None, speed=1.0)
        if settings is not None:
            defaults.apply_update(settings)
        # the gateway says when an utterance ends; until then a context waits for its audio
        # (its speak may wait behind the utterance before it)
        kwargs.setdefault("stop_frame_timeout_s", 10.0)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # words come with timestamps
            push_start_frame=True,
            append_trailing_space=True,  # between sentences, when they are aggregated
            sample_rate=SAMPLE_RATE,
            settings=defaults,
            **kwargs,
        )
        self._url = speak_ws_url(url)
        self._api_key = api_key
        self._receive_task: asyncio.Task[None] | None = None
        self._queue = UtteranceQueue()
        self._send_lock = asyncio.Lock()
        self._playback: dict[str, _Playback] = {}
        self._register_event_handler("on_utterance_cancelled")

    def can_generate_metrics(self) -> bool:
        return True

    # --- the connection ---------------------------------------------------------------------

    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]
        await super().setup(setup)
        await self._connect()

    async def _connect(self) -> None:
        await super()._connect()  # type: ignore[no-untyped-call]
        await self._connect_websocket()
        if self._websocket and not self._receive_task:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()  # type: ignore[no-untyped-call]
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        if self._websocket and self._websocket.state is State.OPEN:
            return
        self._drop_utterances()
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            logger.debug(f"{self}: connecting to {self._url}")
            self._websocket = await self._websocket_connect(
                self._url, additional_headers=headers, max_size=None
            )
        except Exception as exc:  # refused upgrade (401, 429, 503) or unreachable
            self._websocket = None
            await self.push_error(
                error_msg=f"{self}: cannot connect to {self._url}: {exc}", exception=exc
            )
            await self._call_event_handler("on_connection_error", f"{exc}")
            return
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        try:
            await self.stop_all_metrics()  # type: ignore[no-untyped-call]
            if self._websocket:
                logger.debug(f"{self}: disconnecting")
                await self._websocket.close()
        except Exception as exc:
            logger.warning(f"{self}: closing the WebSocket: {exc}")
        finally:
            self._websocket = None
            self._drop_utterances()
            await self._call_event_handler("on_disconnected")

    def _drop_utterances(self) -> None:
        """A new or closed socket: the utterances of the last one are gone with it (pipecat
        closes their audio contexts on a reconnect)."""
        for context_id in self._queue.connection_lost():
            self._playback.pop(context_id, None)

    async def _send(self, messages: list[Message]) -> None:
        if not messages:
            return
        websocket = self._websocket
        if websocket is None:
            raise ConnectionError(f"{self}: not connected")
        for message in messages:
            await websocket.send(json.dumps(message))

    # --- pipecat's side ---------------------------------------------------------------------

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Send `text` as the context's next delta; the audio arrives on the receive task."""
        if not self._websocket or self._websocket.state is State.CLOSED:
            await self._connect()
        voice = self._voice()
        try:
            async with self._send_lock:
                await self._send(self._queue.text(context_id, text, voice))
            await self.start_tts_usage_metrics(text)
        except Exception as exc:
            yield ErrorFrame(error=f"{self}: sending text: {exc}", exception=exc)
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete: `flush` its utterance."""
        context_id = context_id or self.get_active_audio_context_id()
        if not context_id or not self._websocket:
            return
        try:
            async with self._send_lock:
                await self._send(self._queue.flush(context_id))
        except Exception as exc:
            logger.warning(f"{self}: sending flush: {exc}")

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in: cancel the context's utterance, saying how much of it was played."""
        await self.stop_all_metrics()  # type: ignore[no-untyped-call]
        played = self._played_ms(context_id)
        self._playback.pop(context_id, None)
        if self._websocket:
            try:
                async with self._send_lock:
                    await self._send(self._queue.cancel(context_id, played))
            except Exception as exc:
                logger.warning(f"{self}: sending cancel: {exc}")
        await super().on_audio_context_interrupted(context_id)

    async def on_audio_context_completed(self, context_id: str) -> None:
        self._playback.pop(context_id, None)
        await super().on_audio_context_completed(context_id)

    async def start_word_timestamps(self) -> None:
        context_id = self.get_active_audio_context_id()
        tracker = self._word_timestamp_tracker
        if context_id and not tracker.started:  # its baseline, as the tracker takes it
            playback = self._playback.setdefault(context_id, _Playback())
            playback.started_ns = max(tracker.last_pts, self.get_clock().get_time())
        await super().start_word_timestamps()  # type: ignore[no-untyped-call]

    async def push_frame(
        self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM
    ) -> None:
        if isinstance(frame, TTSAudioRawFrame) and frame.context_id in self._playback:
            self._playback[frame.context_id].pushed_bytes += len(frame.audio)
        await super().push_frame(frame, direction)

    def _played_ms(self, context_id: str) -> float | None:
        """How much of the context has played, as pipecat times it (audio plays from the
        first chunk's baseline on, never more than was pushed); None before it started."""
        playback = self._playback.get(context_id)
        if playback is None or playback.started_ns is None:
            return None
        elapsed_ms = max(0.0, (self.get_clock().get_time() - playback.started_ns) / 1e6)
        return min(elapsed_ms, playback.pushed_bytes / BYTES_PER_MS)

    def _voice(self) -> Voice:
        voice = self._settings.voice
        speed = self._settings.speed
        return Voice(
            voice if isinstance(voice, str) else None,
            float(speed) if isinstance(speed, int | float) else 1.0,
        )

    # --- the gateway's side -----------------------------------------------------------------

    async def _receive_messages(self) -> None:
        websocket = self._websocket
        if websocket is None:
            raise ConnectionError(f"{self}: not connected")
        async for message in websocket:
            if isinstance(message, bytes):
                await self._on_audio(message)
            else:
                await self._on_event(json.loads(message))

    async def _on_audio(self, frame: bytes) -> None:
        try:
            found = self._queue.audio(frame)
        except ValueError as exc:
            logger.warning(f"{self}: {exc}")
            return
        if found is None:
            return  # a cancelled or unknown utterance's late audio
        context_id, pcm = found
        if pcm:
            audio = TTSAudioRawFrame(pcm, SAMPLE_RATE, 1, context_id=context_id)
            await self.append_to_audio_context(context_id, audio)

    async def _on_event(self, body: Any) -> None:
        if not isinstance(body, dict):
            logger.warning(f"{self}: unexpected frame {body!r}")
            return
        kind = body.get("type")
        uid = body.get("utterance_id")
        if kind == "error":
            async with self._send_lock:  # the queue's next speak goes out in order
                report, ended = self._queue.error(body)
                await self._send(ended.messages if ended else [])
            error = KokoroVoiceError.from_frame(body)
            if error.code == "idle_timeout":
                report = False  # the gateway closes an idle socket; the next one reconnects
                logger.debug(f"{self}: {error}")
            if report:
                await self.push_error(
                    error_msg=f"{self}: {error}", exception=error, category=error.category
                )
            if ended is not None:
                await self._end(ended)
        elif kind in ("agent_end", "cancelled"):
            async with self._send_lock:
                ended = self._queue.ended(uid, by_cancel=kind == "cancelled")
                await self._send(ended.messages if ended else [])
            if ended is not None:
                await self._end(ended)
            if kind == "cancelled":
                await self._call_event_handler(
                    "on_utterance_cancelled", uid, body.get("played_ms"), body.get("heard_text")
                )
        elif kind == "words":
            context_id = self._queue.owner(uid)
            words = body.get("words") or []
            if context_id is not None and words:
                times = [(str(w["word"]), float(w["start_ms"]) / 1000) for w in words]
                await self.add_word_timestamps(times, context_id)
        else:  # agent_start, audio_stream_start, text_delta, audio_stream_end
            self._queue.owner(uid)

    async def _end(self, ended: Ended) -> None:
        """An utterance is over: close its audio context (an interrupted one is gone
        already); the next utterance's speak has gone out."""
        context_id = ended.context_id
        if not ended.cancelled and self.audio_context_available(context_id):
            await self.stop_ttfb_metrics()
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)


def speak_ws_url(url: str) -> str:
    """The speak WebSocket's address for a gateway URL (http(s) becomes ws(s))."""
    url = url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            url = ws + url[len(http) :]
    if not url.endswith("/v1/speak/ws"):
        url += "/v1/speak/ws"
    return url
