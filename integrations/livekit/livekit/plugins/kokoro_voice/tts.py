"""LiveKit Agents TTS over the Kokoro voice gateway.

`TTS.stream()`: each `SynthesizeStream` (a turn) is one context on one WebSocket the TTS shares
among its streams, the gateway's speak WebSocket in protocol 2 (`/v1/speak/ws?protocol=2`: the
gateway must speak it). A stream opens its context with `speak` naming it, with no text (the
stream sends it, `bidi`, PCM at the TTS's `sample_rate`, word timestamps), the moment its first
text comes, then each `push_text` as a `text` delta and the first `flush`/`end_input` as
`close_context`. The gateway cuts the text into sentences and synthesizes each one as soon as it
is complete, so the first audio comes while the LLM is still writing. Contexts play side by side
on the gateway, so a stream never waits for another: the next turn's `speak` goes out while the
last one's audio is still coming. Audio frames (prefixed with the context id) and events (naming
it) go to their stream by that id; `words` events become the aligned transcript. An error during
the reply (`tts_*`, `text_too_long`) is logged and the stream reads on to its `agent_end`; only
an error that refuses the context ends it. Closing the stream mid-turn (a barge-in) returns at
once: a task the TTS owns sends `cancel` naming the context and reads up to its `cancelled`
(the gateway has stopped the synthesis in the model server), while the next stream's context
opens at once, without waiting for it (`TTS.aclose` ends those tasks). The socket is read all
the time, so one the gateway closes (its `idle_timeout`) is known at once and the next stream
opens a fresh one; one unused for `max_idle_s` is replaced before it is used.

`TTS.synthesize()`: one `POST /v1/audio/speech` (the gateway's OpenAI route), PCM in
Server-Sent Events, so a failure after the headers is an error rather than short audio.

The gateway's errors become LiveKit's: `APIStatusError` with the status its HTTP routes give the
code and `retryable` as the gateway says; a refused WebSocket upgrade with its HTTP status.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import weakref
from dataclasses import dataclass, replace
from typing import Any, Never, Self

import aiohttp
from kokoro_voice_client import SSEDataDecoder, endpoints, ends_context, speak_ws_url
from kokoro_voice_client import speak_ws as msg
from kokoro_voice_client.errors import CLOSING
from kokoro_voice_client.speak_ws import (
    CONTEXT_KEY,
    NUM_CHANNELS,
    PCM_RATES,
    PROTOCOL_2,
    SAMPLE_RATE,
    split_audio_frame,
)
from livekit.agents import (
    APIConnectionError,
    APIConnectOptions,
    APIError,
    APIStatusError,
    APITimeoutError,
    tts,
    utils,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given

from . import _wire
from .log import logger

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "KOKORO_VOICE_URL"
API_KEY_ENV = "KOKORO_VOICE_API_KEY"
MODEL = "kokoro-82m"
# The gateway closes a WebSocket with no context playing for --idle-timeout-s (60 s by
# default): a socket unused for longer than this is replaced before a stream uses it.
MAX_IDLE_S = 50.0

_CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)
_WS = aiohttp.ClientWebSocketResponse
# what the gateway answers a cancel whose context had ended meanwhile
_ALREADY_OVER = frozenset({"unknown_context", "nothing_to_cancel", "context_not_open"})


@dataclass(frozen=True)
class _Lost:
    """The socket is gone (closed, or the gateway said it closes it)."""

    reason: str


_Item = bytes | dict[str, Any] | _Lost  # what a context's queue carries: PCM, an event, the end


@dataclass
class _TTSOptions:
    voice: str | None
    speed: float


def _check_rate(rate: int) -> int:
    if rate not in PCM_RATES:
        raise ValueError(f"sample_rate must be one of {', '.join(map(str, PCM_RATES))}, not {rate}")
    return rate


def _check_speed(speed: float) -> float:
    if not 0.5 <= speed <= 2.0:
        raise ValueError(f"speed must be in [0.5, 2.0], not {speed}")
    return speed


class _Socket:
    """The shared speak WebSocket (protocol 2): a reader that hands each audio frame and event
    to the context it names, and one lock for the sends."""

    def __init__(self, ws: _WS) -> None:
        loop = asyncio.get_running_loop()
        self.ws = ws
        self.contexts: dict[str, asyncio.Queue[_Item]] = {}
        self.lost: str | None = None
        self.idle_since = loop.time()
        self._send_lock = asyncio.Lock()
        self.reader = asyncio.create_task(self._read())

    @property
    def usable(self) -> bool:
        return self.lost is None and not self.ws.closed

    def idle_for(self) -> float:
        """How long no context has been open on it (0 while one is)."""
        if self.contexts:
            return 0.0
        return asyncio.get_running_loop().time() - self.idle_since

    def open_context(self, context_id: str) -> asyncio.Queue[_Item]:
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        if self.lost is not None:
            queue.put_nowait(_Lost(self.lost))
        self.contexts[context_id] = queue
        return queue

    def end_context(self, context_id: str) -> None:
        """The context is over here: what still comes for it (a cancelled one's late audio) is
        dropped."""
        if self.contexts.pop(context_id, None) is not None and not self.contexts:
            self.idle_since = asyncio.get_running_loop().time()

    async def send(self, message: msg.Message) -> None:
        async with self._send_lock:
            await self.ws.send_str(msg.encode(message))

    async def close(self) -> None:
        self.reader.cancel()
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await self.ws.close()
        await asyncio.gather(self.reader, return_exceptions=True)

    async def _read(self) -> None:
        reason = "the connection was closed"
        try:
            while True:
                message = await self.ws.receive()
                if message.type is aiohttp.WSMsgType.BINARY:
                    self._on_audio(message.data)
                elif message.type is aiohttp.WSMsgType.TEXT:
                    self._on_event(message.data)
                elif message.type in _CLOSED or message.type is aiohttp.WSMsgType.ERROR:
                    reason = f"the gateway closed the connection ({self.ws.close_code})"
                    return
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            reason = f"reading the connection failed: {exc!r}"
        finally:
            self._lose(reason)

    def _lose(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
        for queue in self.contexts.values():
            queue.put_nowait(_Lost(self.lost))

    def _on_audio(self, frame: bytes) -> None:
        try:
            context_id, pcm = split_audio_frame(frame)
        except ValueError as exc:
            logger.warning("%s", exc)
            return
        queue = self.contexts.get(context_id)
        if queue is not None:  # else a cancelled context's late audio
            queue.put_nowait(pcm)

    def _on_event(self, data: str) -> None:
        try:
            event = json.loads(data)
        except ValueError:
            logger.warning("the gateway sent a frame that is not JSON: %.80r", data)
            return
        if not isinstance(event, dict):
            return
        context_id = event.get(CONTEXT_KEY)
        queue = self.contexts.get(context_id) if isinstance(context_id, str) else None
        if queue is not None:
            queue.put_nowait(event)
        elif event.get("type") == "error" and context_id is None:
            # the gateway closes the socket (known now, before its close frame), or does not
            # speak protocol 2 (`unknown_type`): every context on it is told
            if event.get("code") in CLOSING:
                self.lost = self.lost or str(event.get("code"))
            for queue in self.contexts.values():
                queue.put_nowait(event)


class TTS(tts.TTS[Never]):
    def __init__(
        self,
        *,
        base_url: NotGivenOr[str] = NOT_GIVEN,
        api_key: NotGivenOr[str | None] = NOT_GIVEN,
        voice: str | None = None,
        speed: float = 1.0,
        sample_rate: int = SAMPLE_RATE,
        http_session: aiohttp.ClientSession | None = None,
        max_idle_s: float = MAX_IDLE_S,
    ) -> None:
        """The Kokoro voice gateway as LiveKit Agents' TTS.

        Args:
            base_url: the gateway, `http(s)://host:port` (a trailing `/v1` is accepted);
                default `$KOKORO_VOICE_URL`, else `http://127.0.0.1:8000`.
            api_key: sent as `Authorization: Bearer`: an API key of the gateway, or a token
                minted by its `POST /v1/tokens` (route groups `speak` and `speech`); default
                `$KOKORO_VOICE_API_KEY`; none for a gateway without keys.
            voice: a voice the model servers have, or an OpenAI name the gateway maps
                (`alloy`, `marin`, ...); default: the gateway's default voice.
            speed: 0.5-2.0.
            sample_rate: the rate the gateway speaks at, the room's or the pipeline's, so
                nothing resamples here: 8000, 16000, 22050, 24000 (the model's), 44100, 48000.
            http_session: an aiohttp session to use; default: the job's
                (`livekit.agents.utils.http_context`).
            max_idle_s: the shared WebSocket, when no stream has used it for longer, is
                replaced (keep it below the gateway's `--idle-timeout-s`).
        """
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=_check_rate(sample_rate),
            num_channels=NUM_CHANNELS,
        )
        url = base_url if is_given(base_url) else os.environ.get(URL_ENV, DEFAULT_URL)
        self._endpoints = endpoints(url)
        self._speak_ws = speak_ws_url(url, protocol=PROTOCOL_2)
        key = api_key if is_given(api_key) else os.environ.get(API_KEY_ENV)
        self._api_key = key or None
        self._opts = _TTSOptions(voice=voice, speed=_check_speed(speed))
        self._session = http_session
        self._max_idle_s = max_idle_s
        self._socket: _Socket | None = None
        self._socket_lock = asyncio.Lock()
        self._connects = 0  # sockets opened so far
        self._streams = weakref.WeakSet[SynthesizeStream]()
        self._settling: set[asyncio.Task[None]] = set()  # closed streams' contexts, prewarm

    @property
    def model(self) -> str:
        return MODEL

    @property
    def provider(self) -> str:
        return "kokoro-voice"

    def update_options(
        self,
        *,
        voice: NotGivenOr[str | None] = NOT_GIVEN,
        speed: NotGivenOr[float] = NOT_GIVEN,
    ) -> None:
        """For the streams made from now on (each context names its voice and speed, so the
        socket stays)."""
        if is_given(voice):
            self._opts.voice = voice
        if is_given(speed):
            self._opts.speed = _check_speed(speed)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = utils.http_context.http_session()
        return self._session

    async def _shared_socket(self, limit_s: float) -> tuple[_Socket, bool, float]:
        """The shared socket, opened (or replaced: gone, or idle past `max_idle_s`) when
        needed: the socket, whether it was reused, and how long getting it took."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with self._socket_lock:
            socket = self._socket
            if socket is not None and socket.usable and socket.idle_for() <= self._max_idle_s:
                return socket, True, loop.time() - start
            if socket is not None:
                self._socket = None
                await self._close(socket)
            session = self._ensure_session()
            async with asyncio.timeout(limit_s):
                ws = await session.ws_connect(self._speak_ws, headers=self._headers())
            self._connects += 1
            self._socket = _Socket(ws)
            return self._socket, False, loop.time() - start

    async def _close(self, socket: _Socket) -> None:
        """Closed now: the contexts still on it end with it."""
        if self._socket is socket:
            self._socket = None
        await socket.close()  # (its reader tells the contexts still on it)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    def _settle(self, utterance: _Utterance) -> None:
        """A stream closed mid-turn: cancel its context, in a task of the TTS's own (the
        stream's close, and the next stream's context, do not wait for `cancelled`)."""
        self._spawn(self._settle_context(utterance))

    async def _settle_context(self, utterance: _Utterance) -> None:
        fit = False
        try:
            fit = await utterance.cancel()
        finally:
            utterance.socket.end_context(utterance.uid)
            if not fit:  # the cancel went unanswered: the socket is not trusted
                await self._close(utterance.socket)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> SynthesizeStream:
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)
        return stream

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> ChunkedStream:
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def prewarm(self) -> None:
        async def connect() -> None:
            try:
                await self._shared_socket(DEFAULT_API_CONNECT_OPTIONS.timeout)
            except Exception as exc:
                logger.debug("prewarming the connection failed: %r", exc)

        self._spawn(connect())

    async def __aenter__(self) -> Self:
        return self

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        settling = list(self._settling)
        for task in settling:
            task.cancel()  # a cancel still waiting: its socket is closed as it ends
        await asyncio.gather(*settling, return_exceptions=True)
        if self._socket is not None:
            await self._close(self._socket)


class SynthesizeStream(tts.SynthesizeStream):
    """One turn: one context on the TTS's shared speak WebSocket."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts
        self._opts = replace(tts._opts)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        uid = utils.shortuuid("lk_")
        output_emitter.initialize(
            request_id=uid,
            sample_rate=self._tts.sample_rate,
            num_channels=NUM_CHANNELS,
            mime_type="audio/pcm",
            stream=True,
        )
        try:
            socket, reused, took = await self._tts._shared_socket(self._conn_options.timeout)
        except TimeoutError:
            raise APITimeoutError("connecting to the gateway timed out") from None
        except aiohttp.WSServerHandshakeError as exc:
            raise APIStatusError(
                f"the gateway refused the WebSocket: {exc.status} {exc.message}",
                status_code=exc.status,
                request_id=uid,
            ) from None
        except Exception as exc:
            raise APIConnectionError("could not connect to the gateway") from exc
        self._connection_reused, self._acquire_time = reused, took

        utterance = _Utterance(self, socket, uid, output_emitter)
        try:
            await utterance.run()
        except asyncio.CancelledError:
            # the stream was closed: the TTS cancels the context (and the model server's
            # synthesis) without holding us, or the next stream, up
            self._tts._settle(utterance)
            raise
        except TimeoutError:
            self._tts._settle(utterance)
            raise APITimeoutError("the gateway sent nothing in time") from None
        except APIError:
            self._tts._settle(utterance)
            raise
        except Exception as exc:
            self._tts._settle(utterance)
            raise APIConnectionError("the gateway connection failed") from exc
        else:
            socket.end_context(uid)


def read_deadline(timeout: float, flushed_at: float | None, last_frame_at: float) -> float | None:
    """When a reply that has sent nothing more has taken too long: `timeout` from the last
    frame received or the flush, whichever came later; None while the text is still coming
    (the wait is then the LLM's, not the gateway's)."""
    if flushed_at is None:
        return None
    return max(flushed_at, last_frame_at) + timeout


class _Utterance:
    """One stream's context on the shared socket: the input sent as it comes, the context's
    frames read from its queue."""

    def __init__(
        self, stream: SynthesizeStream, socket: _Socket, uid: str, emitter: tts.AudioEmitter
    ) -> None:
        self.stream = stream
        self.socket = socket
        self.uid = uid
        self.emitter = emitter
        self.queue = socket.open_context(uid)
        self.opened: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.flushed = asyncio.Event()
        self.flushed_at: float | None = None
        self.last_frame_at = asyncio.get_running_loop().time()
        self.answered = False  # the gateway sent an event or audio of the context's reply
        self.over = False  # the gateway ended the context, or the socket is gone

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_input())
        receiver = asyncio.create_task(self._receive_output())
        try:
            await asyncio.gather(sender, receiver)
        finally:
            await utils.aio.gracefully_cancel(sender, receiver)

    async def _send_input(self) -> None:
        """`speak` naming the context with the first text, every text as a `text` delta, then
        one `close_context`: one turn, as LiveKit gives one segment per stream."""
        stream = self.stream
        async for data in stream._input_ch:
            if self.over:  # the gateway ended the context before the text did
                return
            if isinstance(data, tts.SynthesizeStream._FlushSentinel):
                if self.opened.done():
                    await self._close_context()
                    return
                continue  # a flush before any text: nothing to end
            if not self.opened.done():
                self.emitter.start_segment(segment_id=self.uid)
                stream._mark_started()
                opts = stream._opts
                rate = stream._tts.sample_rate
                speak = msg.speak_context(self.uid, opts.voice, opts.speed, sample_rate=rate)
                await self.socket.send(speak)
                self.opened.set_result(True)
            await self.socket.send(msg.context_text(self.uid, data))
        if self.over:
            return
        if self.opened.done():
            await self._close_context()
        else:
            self.over = True  # the input ended with no text: nothing was sent
            self.opened.set_result(False)

    async def _close_context(self) -> None:
        self.flushed_at = asyncio.get_running_loop().time()  # (agent_end may come mid-send)
        self.flushed.set()
        await self.socket.send(msg.close_context(self.uid))

    async def _receive_output(self) -> None:
        if not await self.opened:
            return
        receiving: asyncio.Task[_Item] | None = None
        flushed = asyncio.create_task(self.flushed.wait())
        try:
            while True:
                receiving = receiving or asyncio.create_task(self.queue.get())
                item = await self._next(receiving, flushed)
                receiving = None
                if self._on_item(item):
                    return
        finally:
            for task in (receiving, flushed):
                if task is not None:
                    task.cancel()
            await asyncio.gather(
                *(t for t in (receiving, flushed) if t is not None), return_exceptions=True
            )

    async def _next(self, receiving: asyncio.Task[_Item], flushed: asyncio.Task[Any]) -> _Item:
        """The context's next frame; TimeoutError once the gateway, after our
        `close_context`, has sent nothing for the stream's timeout (`read_deadline`: from the
        last frame, not from the last wait)."""
        loop = asyncio.get_running_loop()
        timeout = self.stream._conn_options.timeout
        while True:
            deadline = read_deadline(timeout, self.flushed_at, self.last_frame_at)
            if deadline is None:  # the text still comes: wait for a frame or the flush
                await asyncio.wait({receiving, flushed}, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.wait({receiving}, timeout=max(0.0, deadline - loop.time()))
            if receiving.done():
                self.last_frame_at = loop.time()
                return receiving.result()
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError

    def _on_item(self, item: _Item) -> bool:
        """One frame of the context's reply; True once it has ended."""
        if isinstance(item, bytes):
            self.answered = True
            self.emitter.push(item)
            return False
        if isinstance(item, _Lost):
            self.over = True
            raise APIConnectionError(f"the connection to the gateway was lost: {item.reason}")
        kind = item.get("type")
        if kind == "error":
            return self._on_error(item)
        self.answered = True
        if kind == "words":
            self.emitter.push_timed_transcript(_wire.timed_words(item))
        elif kind == "agent_end":
            self.over = True
            self.emitter.end_segment()
            return True
        elif kind in ("cancelled", "context_closed"):  # not asked for: the gateway ended it
            self.over = True
            raise APIError(
                f"the gateway ended context {self.uid}: {kind} {item.get('reason', '')}".strip(),
                body=item,
                retryable=False,
            )
        return False

    def _on_error(self, event: dict[str, Any]) -> bool:
        """An error frame naming the context, or the socket (`kokoro_voice_client.errors`):
        before the reply started, one that closes the socket means the connection, not the
        context, is at fault (retried on a fresh one); one that refuses the context, or closes
        the socket, ends the stream; a gateway that does not speak protocol 2 is told; any other
        (`text_too_long`, a `tts_*` failure during the reply, which `agent_end` follows) is
        logged."""
        code = event.get("code")
        if code in CLOSING and not self.answered:
            self.over = True
            raise APIConnectionError(f"the connection was not fit for a context: {code}")
        if code == "unknown_type" and event.get(CONTEXT_KEY) is None:
            self.over = True
            raise APIStatusError(
                "the gateway does not speak the speak WebSocket's protocol 2 (it answered "
                f"{event.get('message')!r}): this plugin needs a gateway with it",
                status_code=400,
                request_id=self.uid,
                body=event,
                retryable=False,
            )
        if ends_context(event, self.uid, self.answered):
            self.over = True
            raise _wire.error_from_frame(event, self.uid)
        logger.warning("context %s: %s: %s", self.uid, code, event.get("message", ""))
        return False

    async def cancel(self) -> bool:
        """Stop the context: `cancel` naming it, then read its frames up to `cancelled` (or an
        end that crossed the cancel), within the stream's timeout. True when the socket is
        still fit for other contexts."""
        if self.over or not self.opened.done() or not self.opened.result():
            return True  # ended, or nothing was sent
        self.over = True
        try:
            async with asyncio.timeout(self.stream._conn_options.timeout):
                await self.socket.send(msg.cancel_context(self.uid))
                while True:
                    item = await self.queue.get()
                    if isinstance(item, _Lost):
                        return False
                    if isinstance(item, bytes):
                        continue  # audio sent before the cancel: dropped
                    kind = item.get("type")
                    if kind in ("cancelled", "agent_end", "context_closed"):
                        return True
                    if kind == "error" and item.get("code") in CLOSING:
                        return False
                    if kind == "error" and item.get("code") in _ALREADY_OVER:
                        return True  # it ended as the cancel went out
        except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
            logger.warning("cancelling context %s failed: %r", self.uid, exc)
            return False


class ChunkedStream(tts.ChunkedStream):
    """One `POST /v1/audio/speech`: PCM as `speech.audio.delta` events."""

    def __init__(self, *, tts: TTS, input_text: str, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, input_text=input_text, conn_options=conn_options)
        self._tts: TTS = tts
        self._opts = replace(tts._opts)

    async def _run(self, output_emitter: tts.AudioEmitter) -> None:
        request_id = utils.shortuuid("lk_")
        output_emitter.initialize(
            request_id=request_id,
            sample_rate=self._tts.sample_rate,
            num_channels=NUM_CHANNELS,
            mime_type="audio/pcm",
        )
        body: dict[str, object] = {
            "model": "kokoro",
            "input": self.input_text,
            "response_format": "pcm",
            "stream_format": "sse",
            "speed": self._opts.speed,
        }
        if self._opts.voice is not None:
            body["voice"] = self._opts.voice
        if self._tts.sample_rate != SAMPLE_RATE:
            body["sample_rate"] = self._tts.sample_rate
        timeout = aiohttp.ClientTimeout(
            sock_connect=self._conn_options.timeout, sock_read=self._conn_options.timeout
        )
        session = self._tts._ensure_session()
        url = self._tts._endpoints.speech
        try:
            async with session.post(
                url, json=body, headers=self._tts._headers(), timeout=timeout
            ) as resp:
                if resp.status != 200:
                    raise _wire.error_from_http(resp.status, await resp.read(), request_id)
                decoder = SSEDataDecoder()
                done = False
                async for chunk in resp.content.iter_any():
                    for data in decoder.push(chunk):
                        event = json.loads(data)
                        kind = event.get("type")
                        if kind == "speech.audio.delta":
                            output_emitter.push(base64.b64decode(event["audio"]))
                        elif kind == "speech.audio.done":
                            done = True
                        elif kind == "error":
                            raise _wire.error_from_sse(event)
                if not done:
                    raise APIConnectionError("the speech stream ended before speech.audio.done")
            output_emitter.flush()
        except APIError:
            raise
        except TimeoutError:
            raise APITimeoutError("the gateway sent nothing in time") from None
        except Exception as exc:
            raise APIConnectionError("the speech request failed") from exc
