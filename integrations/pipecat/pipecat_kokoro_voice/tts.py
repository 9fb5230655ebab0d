"""`KokoroVoiceTTSService`: pipecat's TTS over the Kokoro voice gateway's speak WebSocket.

One long-lived WebSocket to `/v1/speak/ws?protocol=2` (several contexts on one socket: the
gateway must speak protocol 2). Each pipecat context (a turn) is one gateway context: a `speak`
naming it, with no text (the client streams it), the moment its first text comes, then its text
as `text` deltas and `close_context` when its turn ends (pipecat's `flush_audio`). The gateway
answers with binary frames (the context id, then PCM at the rate asked) and `words` frames (word
timings on the context's clock), which become `TTSAudioRawFrame`s and pipecat's word
timestamps. Contexts play side by side on the gateway, so none waits for another here: the next
turn's `speak` goes out while the last one's audio is still coming. An interruption sends
`cancel` naming each of its contexts (with `played_ms` when pipecat has played some of it), and
the next turn opens at once, without waiting for `cancelled`; the cancelled context's late
audio is dropped (`wire.py`).

The gateway ends every context it is sent (`agent_end`, `cancelled`, `context_closed`, an error
that refuses it), and a lost connection ends those it carried (an `ErrorFrame` says one was cut
short). So a context that is the gateway's waits for its audio however long the gateway is
quiet (a slow model, a busy machine): pipecat's idle end (`stop_frame_timeout_s`) applies only
to a context the gateway was never asked to speak (one held while there is no socket), and a
slow answer is never cut short.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from kokoro_voice_client import GatewayError, speak_ws_url
from kokoro_voice_client.speak_ws import CONTEXT_KEY, PCM_RATES, PROTOCOL_2, SAMPLE_RATE, Message
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
from pipecat.services.websocket_service import ReportErrorCallback
from pipecat.utils.context.word_timestamp_tracker import WordTimestamp
from pipecat.utils.errors import ErrorCategory
from pipecat.utils.types import NOT_GIVEN, NotGiven
from websockets.protocol import State

from pipecat_kokoro_voice.wire import ContextTable, Ended, Voice

__all__ = ["KokoroVoiceError", "KokoroVoiceTTSService", "KokoroVoiceTTSSettings", "speak_ws_url"]

# pipecat's categories by the HTTP status the gateway gives an error (its frames carry it)
_BY_STATUS = {
    401: ErrorCategory.AUTHENTICATION,
    403: ErrorCategory.AUTHORIZATION,
    429: ErrorCategory.RATE_LIMIT,
}
# the invalid requests a change of settings clears (pipecat stops giving the service work
# until then); other 400s answer one message and the service goes on
_SETTINGS_ERRORS = frozenset({"unknown_voice", "invalid_field"})


class KokoroVoiceError(Exception):
    """An error frame from the gateway (`kokoro_voice_client.GatewayError`): `code`, `message`,
    `status`, whether a retry may succeed."""

    def __init__(self, error: GatewayError) -> None:
        self.error = error
        self.code = error.code
        self.status = error.status
        self.message = error.message
        self.retryable = error.retryable
        self.utterance_id = error.utterance_id
        self.retry_after_s = error.retry_after_s
        super().__init__(str(error))

    @classmethod
    def from_frame(cls, body: Message) -> KokoroVoiceError:
        return cls(GatewayError.from_frame(body))

    @property
    def category(self) -> ErrorCategory:
        if self.status in _BY_STATUS:
            return _BY_STATUS[self.status]
        if self.code in _SETTINGS_ERRORS:
            return ErrorCategory.INVALID_REQUEST
        if self.code == "tts_unavailable":  # no model server is up
            return ErrorCategory.CONNECTIVITY
        if self.status >= 500 or self.retryable:
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
            stopped an interrupted context (`utterance_id`: its id on the wire); with
            `played_ms`, `heard_text` is what the listener heard of it (the words that ended
            by then, as the text spelled them).

    Args:
        url: the gateway's base URL (`http://`, `https://`, `ws://` or `wss://`) or the full
            `.../v1/speak/ws` address; the gateway must speak protocol 2 (`?protocol=2`,
            asked here).
        api_key: an API key or a token from `POST /v1/tokens`, sent as
            `Authorization: Bearer`; None for a gateway without keys.
        settings: `KokoroVoiceTTSService.Settings(voice=..., speed=...)`.
        text_aggregation_mode: TOKEN by default: the gateway cuts the stream into chunks
            itself (its first clause early), so tokens go on as they come.
        sample_rate: the audio's rate; None: the pipeline's. The gateway speaks it when it
            offers it (8000, 16000, 22050, 24000, 44100, 48000: nothing resamples here), else
            24000, which pipecat's output resamples.
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
        sample_rate: int | None = None,
        **kwargs: Any,
    ) -> None:
        defaults = KokoroVoiceTTSSettings(model=None, voice=None, language=None, speed=1.0)
        if settings is not None:
            defaults.apply_update(settings)
        # pipecat ends a context that is quiet this long; one that is the
        # gateway's is exempt (`_next_audio_context_item`): this is for the others only
        kwargs.setdefault("stop_frame_timeout_s", 10.0)
        super().__init__(
            text_aggregation_mode=text_aggregation_mode,
            push_text_frames=False,  # words come with timestamps
            push_start_frame=True,
            append_trailing_space=True,  # between sentences, when they are aggregated
            sample_rate=sample_rate,
            settings=defaults,
            **kwargs,
        )
        self._url = speak_ws_url(url, protocol=PROTOCOL_2)
        self._api_key = api_key
        self._receive_task: asyncio.Task[None] | None = None
        self._reading: Any = None  # the socket the receive loop reads, or read last
        self._contexts = ContextTable(online=False)
        self._send_lock = asyncio.Lock()
        # one connect or disconnect at a time: run_tts and the receive task's reconnect may
        # both find the socket gone, and only one may open the next
        self._connection_lock = asyncio.Lock()
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
        # a receive loop still running reads the new socket, even one on its way out
        # (`_receive_task_handler`); one that has ended reads no more
        receiving = self._receive_task is not None and not self._receive_task.done()
        if self._websocket and not receiving:
            self._receive_task = self.create_task(self._receive_task_handler(self._report_error))

    async def _disconnect(self) -> None:
        await super()._disconnect()  # type: ignore[no-untyped-call]
        if self._receive_task:
            await self.cancel_task(self._receive_task)
            self._receive_task = None
        await self._disconnect_websocket()

    async def _connect_websocket(self) -> None:
        async with self._connection_lock:
            if self._websocket and self._websocket.state is State.OPEN:
                return  # opened by whoever held the lock before us
            stale, self._websocket = self._websocket, None
            if stale is not None:  # closed or closing: never left open behind us
                await self._close_quietly(stale)
            await self._drop_utterances(keep_unsent=True)
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            try:
                logger.debug(f"{self}: connecting to {self._url}")
                websocket = await self._websocket_connect(
                    self._url, additional_headers=headers, max_size=None
                )
            except Exception as exc:  # refused upgrade (401, 429, 503) or unreachable
                await self.push_error(
                    error_msg=f"{self}: cannot connect to {self._url}: {exc}", exception=exc
                )
                await self._call_event_handler("on_connection_error", f"{exc}")
                return
            self._websocket = websocket
            try:
                async with self._send_lock:  # what waited for a connection goes out first
                    await self._send(self._contexts.connected())
            except Exception as exc:
                logger.warning(f"{self}: sending the held contexts: {exc}")
        await self._call_event_handler("on_connected")

    async def _disconnect_websocket(self) -> None:
        async with self._connection_lock:
            try:
                await self.stop_all_metrics()  # type: ignore[no-untyped-call]
                if self._websocket:
                    logger.debug(f"{self}: disconnecting")
                    await self._websocket.close()
            except Exception as exc:
                logger.warning(f"{self}: closing the WebSocket: {exc}")
            finally:
                self._websocket = None
                await self._drop_utterances()
        await self._call_event_handler("on_disconnected")

    async def _close_quietly(self, websocket: Any) -> None:
        try:
            await websocket.close()
        except Exception as exc:
            logger.debug(f"{self}: closing a stale WebSocket: {exc}")

    async def _drop_utterances(self, *, keep_unsent: bool = False) -> None:
        """A new or closed socket: the contexts on the last one are gone with it; the ones
        never sent (held while there was no socket) too, unless `keep_unsent`. Their audio
        contexts end (pipecat closes every audio context on a disconnect and a reconnect, not
        when run_tts finds the socket gone and opens one), and one cut short on the wire is an
        error, unless the service is disconnecting on purpose (the pipeline's end)."""
        cut = ", ".join(str(self._contexts.wire_id(c)) for c in self._contexts.on_wire())
        lost = self._contexts.connection_lost(keep_unsent=keep_unsent)
        for context_id in lost:
            self._playback.pop(context_id, None)
        if cut and not self._disconnecting:
            error = ConnectionError(
                f"the connection to the gateway was lost before utterance {cut} ended: its "
                "audio is incomplete"
            )
            await self.push_error(error_msg=f"{self}: {error}", exception=error)
        for context_id in lost:
            if self.audio_context_available(context_id):
                await self.remove_audio_context(context_id)  # what came of it still plays

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
        """Send `text` as the context's next delta (its first opens it on the gateway, beside
        any context still playing); the audio arrives on the receive task."""
        if not self._websocket or self._websocket.state is State.CLOSED:
            await self._connect()
        voice = self._voice()
        try:
            async with self._send_lock:
                await self._send(self._contexts.text(context_id, text, voice))
            await self.start_tts_usage_metrics(text)
        except Exception as exc:
            yield ErrorFrame(error=f"{self}: sending text: {exc}", exception=exc)
            yield TTSStoppedFrame(context_id=context_id)
            return
        yield None

    async def flush_audio(self, context_id: str | None = None) -> None:
        """The turn's text is complete (pipecat calls this once, at the turn's end):
        `close_context`. (Protocol 2's `flush`, which keeps a context open, is not used.)"""
        context_id = context_id or self.get_active_audio_context_id()
        if not context_id:
            return
        try:
            async with self._send_lock:
                # with no socket it is marked in the table, and goes out on the next one
                await self._send(self._contexts.close(context_id))
        except Exception as exc:
            logger.warning(f"{self}: sending close_context: {exc}")

    async def on_audio_context_interrupted(self, context_id: str) -> None:
        """Barge-in (pipecat calls this for each context it drops): cancel the context on the
        gateway, saying how much of it was played. The next context opens at once: nothing
        waits for `cancelled`."""
        await self.stop_all_metrics()  # type: ignore[no-untyped-call]
        played = self._played_ms(context_id)
        self._playback.pop(context_id, None)
        if self._websocket:
            try:
                async with self._send_lock:
                    await self._send(self._contexts.cancel(context_id, played))
            except Exception as exc:
                logger.warning(f"{self}: sending cancel: {exc}")
        await super().on_audio_context_interrupted(context_id)

    async def _next_audio_context_item(self, context_id: str) -> Frame | WordTimestamp | None:
        """The playing context's next item (pipecat's playback loop asks), or None at its end.
        pipecat takes `stop_frame_timeout_s` without one as the end; for a context that is the
        gateway's (`ContextTable.carries`) that is only a quiet spell (a slow model, a busy
        machine): it waits on, until the gateway ends the context or its connection is lost."""
        timeout = self._stop_frame_timeout_s
        while True:
            try:
                item: Frame | WordTimestamp | None = await self._audio_context_manager.get(
                    context_id, timeout=timeout
                )
                return item
            except TimeoutError:
                if not self._contexts.carries(context_id):
                    return None  # never the gateway's, or held with no socket: the idle end

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
        return min(elapsed_ms, playback.pushed_bytes / (self._wire_rate * 2 / 1000))

    @property
    def _wire_rate(self) -> int:
        """The rate the gateway speaks at: the pipeline's, when the gateway offers it (then
        nothing resamples here), else the model's 24 kHz, which pipecat's output resamples."""
        return self.sample_rate if self.sample_rate in PCM_RATES else SAMPLE_RATE

    def _voice(self) -> Voice:
        voice = self._settings.voice
        speed = self._settings.speed
        return Voice(
            voice if isinstance(voice, str) else None,
            float(speed) if isinstance(speed, int | float) else 1.0,
            self._wire_rate,
        )

    # --- the gateway's side -----------------------------------------------------------------

    async def _receive_task_handler(self, report_error: ReportErrorCallback) -> None:
        """pipecat's receive loop, run again in the same task while there is a socket it has
        not read. `_connect` starts a receive loop only when none is running, but a loop that
        has read its socket to the end runs on a while after the utterance cut short was
        reported: pipecat reports the drop and gives up (an `on_error` handler may hold it
        there). A socket a connect opened in that while is read by this loop: every socket
        gets a reader, whichever of the two comes first."""
        while True:
            await super()._receive_task_handler(report_error)
            if not self._unread():
                return

    def _unread(self) -> bool:
        """The service has a socket the receive loop has not read (and is not disconnecting)."""
        websocket = self._websocket
        return websocket is not None and websocket is not self._reading and not self._disconnecting

    async def _receive_messages(self) -> None:
        """Read the socket; if a connect replaced it while it was read (run_tts found it closed
        before this loop did, or while this loop was busy), then the new one. A socket
        replaced is not a drop for pipecat to reconnect from: its reconnect would close the
        new socket and cut the utterance sent on it."""
        websocket = self._websocket
        if websocket is None:
            raise ConnectionError(f"{self}: not connected")
        while websocket is not None:
            websocket = await self._read(websocket)

    async def _read(self, websocket: Any) -> Any:
        """Read `websocket` to its end. The socket that replaced it meanwhile, if one did, else
        None; what ended the reading is raised when nothing replaced it (pipecat reconnects or
        gives up)."""
        self._reading = websocket
        try:
            async for message in websocket:
                if isinstance(message, bytes):
                    await self._on_audio(message)
                else:
                    await self._on_event(json.loads(message))
        except Exception as exc:
            replacement = await self._reading_ended(websocket)
            if replacement is None:
                raise
            logger.debug(f"{self}: a replaced socket ended ({exc!r}); reading its replacement")
            return replacement
        return await self._reading_ended(websocket)

    async def _reading_ended(self, websocket: Any) -> Any:
        """`websocket` is read no more (closed, or reading it failed). Still the service's
        socket: the contexts on it end with it, whether pipecat reconnects or gives up; None.
        Replaced by a connect (which ended those contexts already): the socket that replaced
        it, to be read next, or None when there is none now (a disconnect)."""
        async with self._connection_lock:
            if self._websocket is websocket:
                await self._drop_utterances(keep_unsent=True)
                return None
            return self._websocket

    async def _on_audio(self, frame: bytes) -> None:
        try:
            found = self._contexts.audio(frame)
        except ValueError as exc:
            logger.warning(f"{self}: {exc}")
            return
        if found is None:
            return  # a cancelled or unknown context's late audio
        context_id, pcm = found
        if pcm:
            audio = TTSAudioRawFrame(pcm, self._wire_rate, 1, context_id=context_id)
            await self.append_to_audio_context(context_id, audio)

    async def _on_event(self, body: Any) -> None:
        if not isinstance(body, dict):
            logger.warning(f"{self}: unexpected frame {body!r}")
            return
        kind = body.get("type")
        wire_id = body.get(CONTEXT_KEY)
        if kind == "error":
            refused = self._contexts.not_protocol_2(body)
            if refused:
                lacking = ConnectionError(
                    f"the gateway at {self._url} does not speak the speak WebSocket's protocol "
                    f"2 (it answered {body.get('message')!r}): this service needs a gateway "
                    "with it (see its README)"
                )
                await self.push_error(error_msg=f"{self}: {lacking}", exception=lacking)
                for one in refused:
                    await self._end(one)
                return
            report, ended = self._contexts.error(body)
            error = KokoroVoiceError.from_frame(body)
            if error.code in ("idle_timeout", "max_connection_age"):
                # the gateway closes an idle socket, or an old one; the next one reconnects
                report = False
                logger.debug(f"{self}: {error}")
            if report:
                await self.push_error(
                    error_msg=f"{self}: {error}", exception=error, category=error.category
                )
            if ended is not None:
                await self._end(ended)
        elif kind in ("agent_end", "cancelled", "context_closed"):
            ended = self._contexts.ended(wire_id)
            if ended is not None:
                await self._end(ended)
            if kind == "cancelled":
                await self._call_event_handler(
                    "on_utterance_cancelled",
                    wire_id,
                    body.get("played_ms"),
                    body.get("heard_text"),
                )
        elif kind == "words":
            context_id = self._contexts.owner(wire_id)
            words = body.get("words") or []
            if context_id is not None and words:
                times = [(str(w["word"]), float(w["start_ms"]) / 1000) for w in words]
                await self.add_word_timestamps(times, context_id)
        else:  # agent_start, audio_stream_start, text_delta, flushed, audio_stream_end
            self._contexts.owner(wire_id)

    async def _end(self, ended: Ended) -> None:
        """A context is over: close its audio context (an interrupted one is gone
        already)."""
        context_id = ended.context_id
        if not ended.cancelled and self.audio_context_available(context_id):
            await self.stop_ttfb_metrics()
            await self.append_to_audio_context(context_id, TTSStoppedFrame(context_id=context_id))
            await self.remove_audio_context(context_id)
