"""LiveKit Agents TTS over the Kokoro voice gateway.

`TTS.stream()`: one utterance per `SynthesizeStream` over the gateway's speak WebSocket
(`/v1/speak/ws`): `speak` with no text (the stream sends it, `bidi`, PCM, word timestamps),
then each `push_text` as a `text` delta and the first `flush`/`end_input` as `flush`. The gateway
cuts the text into sentences and synthesizes each one as soon as it is complete, so the first
audio comes while the LLM is still writing. Audio arrives as 24 kHz s16 mono PCM, `words`
events as the aligned transcript. An error during the reply (`tts_*`, `text_too_long`) is
logged and the stream reads on to its `agent_end`; only an error that refuses the `speak`
ends it. Closing the stream mid-utterance returns at once: a task the TTS owns sends `cancel`,
reads up to `cancelled` (the gateway has stopped the synthesis in the model server) and gives
the connection back to the pool clean (`TTS.aclose` ends those tasks). The gateway plays one
utterance at a time per connection: connections come from a pool, one per stream in flight; a
pooled one the gateway has closed meanwhile (its `idle_timeout`) is found and replaced.

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
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any, Never, Self

import aiohttp
from kokoro_voice_client import SSEDataDecoder, endpoints, ends_utterance, is_stale
from kokoro_voice_client import speak_ws as msg
from kokoro_voice_client.speak_ws import NUM_CHANNELS, PCM_RATES, SAMPLE_RATE, split_audio_frame
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
# The gateway closes a WebSocket idle for --idle-timeout-s (60 s by default): a pooled
# connection unused for longer than this is not reused.
MAX_IDLE_S = 50.0

_CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)
_WS = aiohttp.ClientWebSocketResponse
_Input = str | tts.SynthesizeStream._FlushSentinel  # what a stream's input channel carries


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
            max_idle_s: a pooled WebSocket unused for longer is not reused (keep it below
                the gateway's `--idle-timeout-s`).
        """
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=_check_rate(sample_rate),
            num_channels=NUM_CHANNELS,
        )
        url = base_url if is_given(base_url) else os.environ.get(URL_ENV, DEFAULT_URL)
        self._endpoints = endpoints(url)
        key = api_key if is_given(api_key) else os.environ.get(API_KEY_ENV)
        self._api_key = key or None
        self._opts = _TTSOptions(voice=voice, speed=_check_speed(speed))
        self._session = http_session
        self._pool = utils.ConnectionPool[_WS](
            connect_cb=self._connect_ws,
            close_cb=self._close_ws,
            max_session_duration=max_idle_s,
            mark_refreshed_on_get=True,
        )
        self._streams = weakref.WeakSet[SynthesizeStream]()
        self._settling: set[asyncio.Task[None]] = set()  # closed streams' connections

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
        """For the streams made from now on (each utterance names its voice and speed, so the
        pooled connections stay)."""
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

    def _settle(self, utterance: _Utterance) -> None:
        """A stream closed mid-utterance: stop the gateway's reply and give the connection
        back, in a task of the TTS's own (the stream's close does not wait for it)."""
        task = asyncio.create_task(self._settle_connection(utterance))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _settle_connection(self, utterance: _Utterance) -> None:
        reusable = False
        try:
            reusable = await utterance.cancel()
        finally:
            if reusable:
                self._pool.put(utterance.ws)
            else:
                await self._discard(utterance.ws)

    async def _discard(self, ws: _WS) -> None:
        """Out of the pool and closed now, not at the pool's next drain: a reply the gateway
        may still be playing on it ends with it."""
        self._pool.remove(ws)
        with contextlib.suppress(Exception):
            async with asyncio.timeout(1.0):
                await ws.close()

    async def _connect_ws(self, limit_s: float) -> _WS:
        session = self._ensure_session()
        async with asyncio.timeout(limit_s):
            return await session.ws_connect(self._endpoints.speak_ws, headers=self._headers())

    async def _close_ws(self, ws: _WS) -> None:
        await ws.close()

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
        self._pool.prewarm()

    async def __aenter__(self) -> Self:
        return self

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        settling = list(self._settling)
        for task in settling:
            task.cancel()  # their connections are closed as they end
        await asyncio.gather(*settling, return_exceptions=True)
        await self._pool.aclose()


class SynthesizeStream(tts.SynthesizeStream):
    """One utterance over one pooled speak WebSocket."""

    def __init__(self, *, tts: TTS, conn_options: APIConnectOptions) -> None:
        super().__init__(tts=tts, conn_options=conn_options)
        self._tts: TTS = tts
        self._opts = replace(tts._opts)
        # the input an attempt has taken from the channel: a retry (nothing was heard yet)
        # sends it again
        self._taken: list[_Input] = []

    async def _acquire(self) -> _WS:
        pool = self._tts._pool
        while True:
            ws = await pool.get(timeout=self._conn_options.timeout)
            if await _idle_and_open(ws):
                self._acquire_time = pool.last_acquire_time
                self._connection_reused = pool.last_connection_reused
                return ws
            # the gateway closed it (idle, draining) since it went back to the pool
            await self._tts._discard(ws)

    async def _input(self) -> AsyncIterator[_Input]:
        """The stream's input: what an earlier attempt took, then the channel."""
        for data in list(self._taken):
            yield data
        async for data in self._input_ch:
            self._taken.append(data)
            yield data

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
            ws = await self._acquire()
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

        utterance = _Utterance(self, ws, uid, output_emitter)
        reusable = False
        settled = False
        try:
            await utterance.run()
            reusable = utterance.clean
        except asyncio.CancelledError:
            # the stream was closed: the TTS stops the gateway's reply (and the model
            # server's synthesis) before the connection is reused, without holding us up
            self._tts._settle(utterance)
            settled = True
            raise
        except APIError:
            raise
        except TimeoutError:
            raise APITimeoutError("the gateway sent nothing in time") from None
        except Exception as exc:
            raise APIConnectionError("the gateway connection failed") from exc
        finally:
            if settled:
                pass
            elif reusable:
                self._tts._pool.put(ws)
            else:
                await self._tts._discard(ws)


async def _idle_and_open(ws: _WS) -> bool:
    """A pooled connection is fit for the next utterance: open, and nothing waiting on it.
    aiohttp marks a socket closed only once something reads the close frame, so a gateway's
    `idle_timeout` frame and close sit unread in an idle one: a receive that does not wait
    finds them (and reading the close is what makes aiohttp mark it closed)."""
    if ws.closed:
        return False
    try:
        async with asyncio.timeout(0):
            await ws.receive()
    except TimeoutError:
        # nothing was waiting (aiohttp marks the read it gave up as 1006), unless it was a
        # close frame whose reply the zero wait cut short
        return not ws.closed and ws.close_code in (None, aiohttp.WSCloseCode.ABNORMAL_CLOSURE)
    return False  # a frame was waiting: the gateway's goodbye, or something stray


def read_deadline(timeout: float, flushed_at: float | None, last_frame_at: float) -> float | None:
    """When a reply that has sent nothing more has taken too long: `timeout` from the last
    frame received or the flush, whichever came later; None while the text is still coming
    (the wait is then the LLM's, not the gateway's)."""
    if flushed_at is None:
        return None
    return max(flushed_at, last_frame_at) + timeout


class _Utterance:
    """The speak WebSocket's side of one stream: the input sent as it comes, the frames read."""

    def __init__(
        self, stream: SynthesizeStream, ws: _WS, uid: str, emitter: tts.AudioEmitter
    ) -> None:
        self.stream = stream
        self.ws = ws
        self.uid = uid
        self.emitter = emitter
        self.opened: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.flushed = asyncio.Event()
        self.flushed_at: float | None = None
        self.last_frame_at = asyncio.get_running_loop().time()
        self.answered = False  # the gateway sent an event or audio of our reply
        self.ended = False  # agent_end came
        self.clean = False  # ... after our flush: nothing we sent is still unanswered

    async def run(self) -> None:
        sender = asyncio.create_task(self._send_input())
        receiver = asyncio.create_task(self._receive_output())
        try:
            await asyncio.gather(sender, receiver)
        finally:
            await utils.aio.gracefully_cancel(sender, receiver)

    async def _send(self, message: msg.Message) -> None:
        await self.ws.send_str(msg.encode(message))

    async def _send_input(self) -> None:
        """`speak` with the first text, every text as a `text` delta, then one `flush`: one
        utterance, as LiveKit gives one segment per stream."""
        stream = self.stream
        async for data in stream._input():
            if self.ended:  # the gateway ended the reply before the text did
                return
            if isinstance(data, tts.SynthesizeStream._FlushSentinel):
                if self.opened.done():
                    await self._flush()
                    return
                continue  # a flush before any text: nothing to end
            if not self.opened.done():
                self.emitter.start_segment(segment_id=self.uid)
                stream._mark_started()
                opts = stream._opts
                rate = stream._tts.sample_rate
                await self._send(msg.speak(self.uid, opts.voice, opts.speed, sample_rate=rate))
                self.opened.set_result(True)
            await self._send(msg.text(data))
        if self.ended:
            return
        if self.opened.done():
            await self._flush()
        else:
            self.clean = True  # the input ended with no text: nothing was sent
            self.opened.set_result(False)

    async def _flush(self) -> None:
        self.flushed_at = asyncio.get_running_loop().time()  # (agent_end may come mid-send)
        self.flushed.set()
        await self._send(msg.FLUSH)

    async def _receive_output(self) -> None:
        if not await self.opened:
            return
        receiving: asyncio.Task[aiohttp.WSMessage] | None = None
        flushed = asyncio.create_task(self.flushed.wait())
        try:
            while True:
                receiving = receiving or asyncio.create_task(self.ws.receive())
                message = await self._next(receiving, flushed)
                receiving = None
                if self._on_frame(message):
                    return
        finally:
            for task in (receiving, flushed):
                if task is not None:
                    task.cancel()
            await asyncio.gather(
                *(t for t in (receiving, flushed) if t is not None), return_exceptions=True
            )

    async def _next(
        self, receiving: asyncio.Task[aiohttp.WSMessage], flushed: asyncio.Task[Any]
    ) -> aiohttp.WSMessage:
        """The next frame; TimeoutError once the gateway, after our flush, has sent nothing
        for the stream's timeout (`read_deadline`: from the last frame, not from the last
        wait)."""
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

    def _on_frame(self, message: aiohttp.WSMessage) -> bool:
        """One frame of the reply; True once it has ended."""
        if message.type is aiohttp.WSMsgType.BINARY:
            owner, pcm = split_audio_frame(message.data)
            if owner == self.uid:  # else late audio of an earlier, cancelled utterance
                self.answered = True
                self.emitter.push(pcm)
            return False
        if message.type in _CLOSED or message.type is aiohttp.WSMsgType.ERROR:
            raise APIConnectionError(f"the gateway closed the connection ({self.ws.close_code})")
        if message.type is not aiohttp.WSMsgType.TEXT:
            return False
        event = json.loads(message.data)
        kind = event.get("type")
        if kind == "error":
            return self._on_error(event)
        if event.get("utterance_id", self.uid) != self.uid:
            return False
        self.answered = True
        if kind == "words":
            self.emitter.push_timed_transcript(_wire.timed_words(event))
        elif kind == "agent_end":
            self.ended = True
            self.clean = self.flushed_at is not None
            self.emitter.end_segment()
            return True
        return False

    def _on_error(self, event: dict[str, Any]) -> bool:
        """An error frame (`kokoro_voice_client.errors`): on a connection whose reply has not
        started, one the gateway closed or that answers something from before means the
        connection, not the utterance, is at fault (retried on a fresh one); one that refuses
        the `speak`, or closes the connection, ends the stream; any other (`text_too_long`,
        a `tts_*` failure during the reply, which `agent_end` follows) is logged."""
        if not self.answered and is_stale(event):
            raise APIConnectionError(
                f"the connection was not fit for an utterance: {event.get('code')}"
            )
        if ends_utterance(event, self.uid, self.answered):
            raise _wire.error_from_frame(event, self.uid)
        logger.warning(
            "utterance %s: %s: %s", self.uid, event.get("code"), event.get("message", "")
        )
        return False

    async def cancel(self) -> bool:
        """Stop the utterance: `cancel`, then read up to `cancelled` (or `nothing_to_cancel`:
        it had just ended), within the stream's timeout. True when the connection is clean for
        the next utterance."""
        if self.ended:
            return self.clean and not self.ws.closed
        if not self.opened.done() or not self.opened.result():
            return not self.ws.closed  # nothing was sent
        try:
            async with asyncio.timeout(self.stream._conn_options.timeout):
                await self._send(msg.cancel())
                while True:
                    message = await self.ws.receive()
                    if message.type in _CLOSED or message.type is aiohttp.WSMsgType.ERROR:
                        return False
                    if message.type is not aiohttp.WSMsgType.TEXT:
                        continue
                    event = json.loads(message.data)
                    if event.get("type") == "cancelled":
                        return True
                    if event.get("type") == "error" and event.get("code") == "nothing_to_cancel":
                        return True
        except (TimeoutError, aiohttp.ClientError, ConnectionError, ValueError) as exc:
            logger.warning("cancelling utterance %s failed: %r", self.uid, exc)
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
