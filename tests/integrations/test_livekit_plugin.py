"""The LiveKit Agents plugin (`livekit.plugins.kokoro_voice`) and LiveKit's own OpenAI TTS
against the real gateway on loopback, through LiveKit's stream API (`push_text`, `flush`,
`end_input`) and `synthesize()`. The fake engine makes every character 10 ms of a loud square
wave (tests/support/fakes.py), so audio lengths and word times follow from the text; one case
of each runs on the real Kokoro-82M model.

Outside a LiveKit job there is no http session: `utils.http_context.open()` binds one, as
LiveKit's docs say to do in tests and scripts."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
import pytest
from kokoro_voice_client import speak_ws as msg
from kokoro_voice_client import split_audio_frame
from livekit.agents import APIStatusError, tts
from livekit.agents.metrics import TTSMetrics
from livekit.agents.types import (
    USERDATA_TIMED_TRANSCRIPT,
    APIConnectOptions,
    NotGivenOr,
    TimedString,
)
from livekit.agents.utils import http_context, is_given
from livekit.plugins import kokoro_voice, openai
from livekit.plugins.kokoro_voice import _wire

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from tests.support.fakes import FakeEngine, expected_pcm_bytes
from tests.support.gateway_client import wait_for_metric
from tests.support.servers import RunningServer, serve

KEY = "lk-agent-key-0123456789abcdef"
NO_RETRY = APIConnectOptions(max_retry=0)
MARKER = b"\x00\x00" * 240  # 10 ms of silence (tts.AudioEmitter's is_final marker)


@pytest.fixture
async def http_session() -> AsyncIterator[None]:
    """The job's http session, outside a job."""
    async with http_context.open():
        yield


@dataclass
class Heard:
    """What a LiveKit consumer gets from a stream: the PCM of its frames and the aligned
    transcript attached to them, in order."""

    pcm: bytes = b""
    words: list[TimedString] = field(default_factory=list)
    frames: int = 0
    rate: int = 24_000  # the frames' sample rate, as the plugin was asked for

    def matches(self, reference: bytes) -> bool:
        """The reference audio, maybe followed by LiveKit's marker: `tts.AudioEmitter` ends a
        segment with 10 ms of silence when it holds no audio back for its final frame (its
        flush timer decides which)."""
        return self.pcm in (reference, reference + MARKER)

    def add(self, event: tts.SynthesizedAudio) -> None:
        assert event.frame.sample_rate == self.rate
        assert event.frame.num_channels == 1
        self.pcm += event.frame.data.tobytes()
        self.words += event.frame.userdata.get(USERDATA_TIMED_TRANSCRIPT, [])
        self.frames += 1


async def hear(stream: tts.SynthesizeStream | tts.ChunkedStream) -> Heard:
    heard = Heard(rate=stream._tts.sample_rate)
    async for event in stream:
        heard.add(event)
    return heard


async def speak(engine: kokoro_voice.TTS, deltas: list[str]) -> Heard:
    async with engine.stream(conn_options=NO_RETRY) as stream:
        for delta in deltas:
            stream.push_text(delta)
        stream.end_input()
        return await hear(stream)


def loud(pcm: bytes) -> float:
    """RMS of 16-bit PCM, in full-scale units."""
    samples = np.frombuffer(pcm, np.int16).astype(np.float64) / 32768
    return float(np.sqrt(np.mean(samples**2)))


def fake_speech(pcm: bytes, texts: list[str]) -> bool:
    """The fake engine's audio for these chunks, in order: per chunk, its characters' square
    wave at ±0.5 (10 ms each), then the tail pause of silence."""
    samples = np.frombuffer(pcm, np.int16)
    at = 0
    for text in texts:
        wave, end = len(text) * 240, expected_pcm_bytes(text) // 2
        chunk = samples[at : at + end]
        if not (np.all(np.abs(chunk[:wave]) == 16384) and np.all(chunk[wave:] == 0)):
            return False
        at += end
    return samples[at:].tobytes() in (b"", MARKER)  # (see Heard.matches)


def assert_aligned(words: list[TimedString], text: str) -> None:
    """The timed words spell the text in order (punctuation may stay out of them), each one
    string with the space that joins it to the next, and the times never go back."""
    position = 0
    for word in words:
        assert word.endswith(" "), repr(word)
        assert word.strip() == word[:-1], repr(word)
        position = text.index(word.strip(), position) + len(word.strip())
    assert text[position:].strip(" .!?,") == ""
    starts = [seconds(w.start_time) for w in words]
    ends = [seconds(w.end_time) for w in words]
    assert starts == sorted(starts)
    assert all(s < e for s, e in zip(starts, ends, strict=True))
    timed = list(zip(words, starts, ends, strict=True))
    assert all(e <= s for e, s in zip(ends, starts[1:], strict=False)), timed


def seconds(time: NotGivenOr[float]) -> float:
    assert is_given(time)
    return time


def deltas_of(text: str, size: int) -> list[str]:
    """The text as an LLM streams it: a few characters at a time."""
    return [text[i : i + size] for i in range(0, len(text), size)]


# --- the wire format, pure ---------------------------------------------------------------------


def test_gateway_errors_keep_their_code_and_retryable() -> None:
    voice = _wire.error_from_frame(
        {
            "type": "error",
            "code": "unknown_voice",
            "message": "no such voice",
            "retryable": False,
            "status": 400,
        }
    )
    assert (voice.status_code, voice.retryable, voice.message) == (
        400,
        False,
        "unknown_voice: no such voice",
    )
    busy = _wire.error_from_frame(
        {"type": "error", "code": "overloaded", "retryable": True, "status": 503}
    )
    assert (busy.status_code, busy.retryable) == (503, True)
    upstream = _wire.error_from_frame({"type": "error", "code": "tts_not_ready", "retryable": True})
    assert (upstream.status_code, upstream.retryable) == (502, True)
    body = b'{"error": {"code": "rate_limited", "message": "slow down", "retryable": true}}'
    limited = _wire.error_from_http(429, body)
    assert (limited.status_code, limited.retryable, limited.body) == (
        429,
        True,
        {"code": "rate_limited", "message": "slow down", "retryable": True},
    )
    assert _wire.error_from_http(502, b"<html>bad gateway</html>").retryable


# --- the plugin's stream on the fake engine ----------------------------------------------------


def test_it_registers_as_a_livekit_plugin() -> None:
    from livekit.agents import Plugin

    (plugin,) = [
        p for p in Plugin.registered_plugins if p.package == "livekit.plugins.kokoro_voice"
    ]
    assert plugin.version == kokoro_voice.__version__
    engine = kokoro_voice.TTS(base_url="http://127.0.0.1:1")
    assert engine.capabilities == tts.TTSCapabilities(streaming=True, aligned_transcript=True)
    assert (engine.sample_rate, engine.num_channels) == (24_000, 1)


async def test_one_sentence_streams_all_its_audio_and_its_words(
    gateway_on_fake: RunningServer, http_session: None
) -> None:
    text = "Hello there."
    async with kokoro_voice.TTS(base_url=gateway_on_fake.http_url) as engine:
        heard = await speak(engine, deltas_of(text, 3))
    assert fake_speech(heard.pcm, [text])  # the prefixes gone, nothing lost
    assert [w.strip() for w in heard.words] == ["Hello", "there."]
    assert_aligned(heard.words, text)
    # the fake gives every character 10 ms, from the utterance's first sample
    assert heard.words[0].start_time == 0.0
    assert heard.words[1].start_time == pytest.approx(0.06)


async def test_the_gateway_speaks_at_the_rate_the_agent_runs_at(
    gateway_on_fake: RunningServer, http_session: None
) -> None:
    """`sample_rate=16000`: the gateway resamples, the frames say 16 kHz, the audio is the
    24 kHz reply's length at 16 kHz (LiveKit's 10 ms end marker aside), and the word timings are
    the same milliseconds, on the WebSocket stream and the OpenAI route alike."""
    text = "Hello there."
    with pytest.raises(ValueError, match="sample_rate must be one of 8000, 16000"):
        kokoro_voice.TTS(base_url=gateway_on_fake.http_url, sample_rate=11_025)
    async with kokoro_voice.TTS(base_url=gateway_on_fake.http_url, sample_rate=16_000) as engine:
        assert engine.sample_rate == 16_000
        streamed = await speak(engine, deltas_of(text, 3))
        batch = await hear(engine.synthesize(text, conn_options=NO_RETRY))
    expected = expected_pcm_bytes(text) // 2 * 2 / 3  # samples at 16 kHz
    for heard in (streamed, batch):
        samples = len(heard.pcm) // 2
        assert any(abs(samples - (expected + marker)) <= 2 for marker in (0, 160)), samples
        assert loud(heard.pcm) > 0.3
    assert [w.strip() for w in streamed.words] == ["Hello", "there."]
    assert streamed.words[1].start_time == pytest.approx(0.06)


async def test_audio_comes_while_the_text_is_still_coming(
    gateway_on_fake: RunningServer, http_session: None
) -> None:
    """The first sentence is spoken before the rest of the text exists; the whole reply's
    audio is what the gateway's own WebSocket gives for the same text."""
    first, rest = "Hello there, my friend. ", "Your order shipped today. It arrives on Tuesday."
    async with (
        kokoro_voice.TTS(base_url=gateway_on_fake.http_url) as engine,
        engine.stream(conn_options=NO_RETRY) as stream,
    ):
        for delta in deltas_of(first, 4):
            stream.push_text(delta)
        heard = Heard()
        heard.add(await anext(stream))  # audio, and no more text has been pushed
        for delta in deltas_of(rest, 4):
            stream.push_text(delta)
        stream.flush()
        stream.end_input()
        async for event in stream:
            heard.add(event)
    reference = await gateway_ws_audio(gateway_on_fake, first, rest)
    assert heard.matches(reference)
    assert_aligned(heard.words, first + rest)
    assert heard.words[-1].strip() == "Tuesday."


async def gateway_ws_audio(gateway: RunningServer, first: str, rest: str) -> bytes:
    """The same text, streamed the same way (the rest after the first audio), through a plain
    websockets client: its audio frames' PCM."""
    import orjson
    from websockets.asyncio.client import connect

    from tests.support.gateway_client import ws_reply_audio

    async with connect(gateway.ws_url + "/v1/speak/ws") as ws:
        await ws.send(msg.encode(msg.speak("ref", None, 1.0)))
        for delta in deltas_of(first, 4):
            await ws.send(orjson.dumps({"type": "text", "delta": delta}).decode())
        while isinstance(frame := await ws.recv(), str):
            assert orjson.loads(frame)["type"] != "error", frame
        for delta in deltas_of(rest, 4):
            await ws.send(orjson.dumps({"type": "text", "delta": delta}).decode())
        await ws.send(msg.encode(msg.FLUSH))
        audio, _ = await ws_reply_audio(ws)
    return split_audio_frame(frame)[1] + audio


async def test_closing_a_stream_mid_utterance_cancels_down_to_the_model_server(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine, http_session: None
) -> None:
    first = "Hello there, my friend. "  # long enough for the chunker to let it go alone
    reused: list[bool] = []
    async with kokoro_voice.TTS(base_url=gateway_on_fake.http_url) as engine:
        engine.on("metrics_collected", lambda m: reused.append(m.connection_reused))
        stream = engine.stream(conn_options=NO_RETRY)
        stream.push_text(first)
        heard = Heard()
        heard.add(await anext(stream))  # the first sentence is playing
        fake_engine.hold = True  # the next synthesis runs until cancelled
        stream.push_text("And this sentence is never heard. " * 3)
        stream.flush()
        assert await asyncio.to_thread(fake_engine.entered.wait, 10)
        await stream.aclose()  # the listener barged in: returns at once
        # the TTS's own task cancels the context and reads `cancelled`; the model server's
        # cancel reaches its engine thread on its own
        await asyncio.gather(*engine._settling)
        assert await asyncio.to_thread(fake_engine.cancel_seen.wait, 10)
        assert "never heard" in fake_engine.cancelled[0]
        async for event in stream:  # nothing more comes
            heard.add(event)
        assert 0 < len(heard.pcm) <= expected_pcm_bytes(first.strip())
        fake_engine.hold = False
        # the socket stays: the next turn is a context on it and hears only its own audio
        nxt = await speak(engine, ["Next one."])
        assert engine._connects == 1
    assert fake_speech(nxt.pcm, ["Next one."])
    assert [w.strip() for w in nxt.words] == ["Next", "one."]
    assert reused[-1] is True


async def test_one_socket_serves_stream_after_stream(
    gateway_on_fake: RunningServer, http_session: None
) -> None:
    collected: list[TTSMetrics] = []
    async with kokoro_voice.TTS(base_url=gateway_on_fake.http_url) as engine:
        engine.on("metrics_collected", collected.append)
        for text in ["Hello there.", "Good morning.", "See you."]:
            heard = await speak(engine, deltas_of(text, 5))
            assert fake_speech(heard.pcm, [text])
        assert engine._connects == 1
    assert [m.connection_reused for m in collected] == [False, True, True]
    assert [m.characters_count for m in collected] == [12, 13, 8]


async def test_an_unknown_voice_is_a_client_error_not_retried(
    gateway_on_fake: RunningServer, http_session: None
) -> None:
    async with kokoro_voice.TTS(base_url=gateway_on_fake.http_url, voice="xx_nobody") as engine:
        errors: list[tts.TTSError] = []
        engine.on("error", errors.append)
        # the default options: retryable errors would be retried three times
        async with engine.stream() as stream:
            stream.push_text("Hello there.")
            stream.end_input()
            with pytest.raises(APIStatusError) as raised:
                await hear(stream)
        assert raised.value.status_code == 400
        assert raised.value.retryable is False
        assert isinstance(raised.value.body, dict)
        assert raised.value.body["code"] == "unknown_voice"
        assert "xx_nobody" in raised.value.message
        assert [e.recoverable for e in errors] == [False]  # raised at once, not retried
        # protocol 2: a refused context leaves the socket as it was, for the next stream
        assert engine._socket is not None
        assert engine._socket.usable
        with pytest.raises(APIStatusError) as batch:
            await hear(engine.synthesize("Hello there."))
        assert (batch.value.status_code, batch.value.retryable) == (400, False)
        assert isinstance(batch.value.body, dict)
        assert batch.value.body["code"] == "unknown_voice"
        # the next stream works, on the same socket
        engine.update_options(voice="af_test")
        heard = await speak(engine, ["Hello there."])
        assert engine._connects == 1
    assert fake_speech(heard.pcm, ["Hello there."])


async def test_synthesize_gives_the_same_audio_as_the_stream(
    gateway_on_fake: RunningServer, http_session: None
) -> None:
    text = "Hello there, my friend. Your order shipped today."
    async with kokoro_voice.TTS(base_url=gateway_on_fake.http_url, voice="af_test") as engine:
        batch = await hear(engine.synthesize(text, conn_options=NO_RETRY))
        streamed = await speak(engine, [text])
    sentences = ["Hello there, my friend.", "Your order shipped today."]  # the two chunks
    assert fake_speech(batch.pcm, sentences)
    assert fake_speech(streamed.pcm, sentences)
    assert loud(batch.pcm) > 0.3
    assert batch.words == []  # the OpenAI route has no timings


@contextlib.contextmanager
def gateway_with_keys(fake_server: RunningServer) -> Iterator[RunningServer]:
    app = create_gateway(
        GatewaySettings(model_server_url=fake_server.http_url, api_keys=f"agent:{KEY}")
    )
    with serve(app) as running:
        yield running


async def test_keys_and_tokens(fake_server: RunningServer, http_session: None) -> None:
    with gateway_with_keys(fake_server) as gw:
        async with httpx.AsyncClient(base_url=gw.http_url) as http:
            minted = await http.post(
                "/v1/tokens", json={"routes": ["speak"]}, headers={"Authorization": f"Bearer {KEY}"}
            )
        token = minted.json()["token"]
        for credential in (KEY, token):
            async with kokoro_voice.TTS(base_url=gw.http_url, api_key=credential) as engine:
                heard = await speak(engine, ["Hello there."])
            assert fake_speech(heard.pcm, ["Hello there."])
        async with kokoro_voice.TTS(base_url=gw.http_url, api_key=None) as anonymous:
            with pytest.raises(APIStatusError) as refused:
                await speak(anonymous, ["Hello there."])
            assert (refused.value.status_code, refused.value.retryable) == (401, False)
            with pytest.raises(APIStatusError) as http_refused:
                await hear(anonymous.synthesize("Hello there."))
            assert (http_refused.value.status_code, http_refused.value.retryable) == (401, False)
        # a token for the speak routes only: not the OpenAI route
        async with kokoro_voice.TTS(base_url=gw.http_url, api_key=token) as narrow:
            with pytest.raises(APIStatusError) as wrong_route:
                await hear(narrow.synthesize("Hello there."))
            assert wrong_route.value.status_code == 403
            assert isinstance(wrong_route.value.body, dict)
            assert wrong_route.value.body["code"] == "token_not_for_route"


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KOKORO_VOICE_URL", "https://voice.example")
    monkeypatch.setenv("KOKORO_VOICE_API_KEY", KEY)
    engine = kokoro_voice.TTS()
    assert engine._endpoints.speak_ws == "wss://voice.example/v1/speak/ws"
    assert engine._speak_ws == "wss://voice.example/v1/speak/ws?protocol=2"
    assert engine._headers() == {"Authorization": f"Bearer {KEY}"}
    assert kokoro_voice.TTS(api_key=None)._headers() == {}
    with pytest.raises(ValueError, match="speed"):
        kokoro_voice.TTS(speed=3.0)


# --- LiveKit's own OpenAI TTS, pointed at the gateway ------------------------------------------


def openai_tts(gateway: RunningServer, **options: Any) -> openai.TTS:
    return openai.TTS(base_url=gateway.http_url + "/v1", api_key="unused", **options)


@pytest.mark.parametrize(
    ("model", "voice"),
    [
        ("tts-1", "alloy"),  # stream_format "audio": the body is the audio
        ("gpt-4o-mini-tts", "marin"),  # LiveKit's default model: stream_format "sse"
    ],
)
async def test_livekits_openai_tts_gets_the_gateways_audio(
    gateway_on_fake: RunningServer, model: str, voice: str
) -> None:
    text = "Hello there."
    engine = openai_tts(gateway_on_fake, model=model, voice=voice, response_format="pcm")
    async with engine:
        heard = await hear(engine.synthesize(text, conn_options=NO_RETRY))
    assert fake_speech(heard.pcm, [text])


async def test_livekits_openai_tts_decodes_the_default_mp3(gateway_on_fake: RunningServer) -> None:
    async with openai_tts(gateway_on_fake, voice="alloy") as engine:
        heard = await hear(engine.synthesize("Hello there.", conn_options=NO_RETRY))
    # decoded MP3: about the PCM's length (the encoder pads its last frame), and loud
    assert len(heard.pcm) == pytest.approx(expected_pcm_bytes("Hello there."), rel=0.1)
    assert loud(heard.pcm) > 0.2


async def test_livekits_openai_tts_names_an_unknown_voice(gateway_on_fake: RunningServer) -> None:
    async with openai_tts(gateway_on_fake, voice="xx_nobody", response_format="pcm") as engine:
        with pytest.raises(APIStatusError) as raised:
            await hear(engine.synthesize("Hello there.", conn_options=NO_RETRY))
    assert (raised.value.status_code, raised.value.retryable) == (400, False)
    assert "unknown_voice" in str(raised.value.body)


# --- the real model ----------------------------------------------------------------------------


@pytest.mark.real_model
async def test_the_real_model_streams_speech_with_aligned_words(
    gateway_server: RunningServer, http_session: None
) -> None:
    text = "Hello there, my friend. Your order shipped today."
    async with kokoro_voice.TTS(base_url=gateway_server.http_url) as engine:
        heard = await speak(engine, deltas_of(text, 3))
        batch = await hear(engine.synthesize("Hello there."))
    assert len(heard.pcm) > 2 * 24_000 * 2  # more than two seconds of speech
    assert loud(heard.pcm) > 0.02
    assert [w.strip() for w in heard.words] == text.split()
    assert_aligned(heard.words, text)
    assert seconds(heard.words[-1].end_time) <= len(heard.pcm) / 48_000
    assert len(batch.pcm) > 24_000
    assert loud(batch.pcm) > 0.02


@pytest.mark.real_model
@pytest.mark.parametrize(("model", "voice"), [("tts-1", "alloy"), ("gpt-4o-mini-tts", "marin")])
async def test_livekits_openai_tts_on_the_real_model(
    gateway_server: RunningServer, model: str, voice: str
) -> None:
    engine = openai_tts(gateway_server, model=model, voice=voice, response_format="pcm")
    async with engine:
        heard = await hear(engine.synthesize("Hello there.", conn_options=NO_RETRY))
    assert len(heard.pcm) > 24_000  # half a second of speech at least
    assert loud(heard.pcm) > 0.02


# --- the frameworks' bench ---------------------------------------------------------------------


async def test_the_bench_times_one_utterance_through_the_plugin(
    gateway_on_fake: RunningServer,
) -> None:
    from bench.frameworks import livekit as bench_livekit

    text = "Hello there, my friend. Your order shipped today."
    measured = await bench_livekit.run(gateway_on_fake.http_url, None, text, "af_test")
    assert measured.client == "livekit"
    assert measured.words == tuple(text.split())
    chunks = ["Hello there, my friend.", "Your order shipped today."]
    # the audio's length, maybe with LiveKit's 10 ms end marker (Heard.matches)
    assert round(measured.audio_s * 48_000) - sum(expected_pcm_bytes(c) for c in chunks) in (0, 480)
    assert measured.first_word_s is not None
    assert 0 < measured.first_audio_s <= measured.first_word_s


# --- connections, errors and closes the gateway's way ------------------------------------------


async def test_a_socket_the_gateway_closed_is_replaced(
    fake_server: RunningServer, http_session: None
) -> None:
    """The gateway closes an idle socket (`idle_timeout`, then close 1000); the socket's reader
    reads that as it comes, so the next stream speaks on a fresh one, no retry needed."""
    app = create_gateway(GatewaySettings(model_server_url=fake_server.http_url, idle_timeout_s=1.0))
    with serve(app) as gw:
        async with kokoro_voice.TTS(base_url=gw.http_url) as engine:
            first = await speak(engine, ["Hello there."])
            assert fake_speech(first.pcm, ["Hello there."])
            assert await wait_for_metric(gw, "gateway_active_sessions", 0, transport="ws") == 0
            shared = engine._socket
            assert shared is not None
            await asyncio.wait({shared.reader}, timeout=5)  # it read the goodbye and close
            assert shared.lost == "idle_timeout"
            assert not shared.usable
            errors: list[tts.TTSError] = []
            engine.on("error", errors.append)
            again = await speak(engine, ["Good morning."])  # NO_RETRY: a 408 would end it
            assert engine._connects == 2
            assert shared.ws.closed
    assert fake_speech(again.pcm, ["Good morning."])
    assert errors == []


async def test_a_goodbye_read_after_the_speak_is_a_retried_connection_error(
    http_session: None,
) -> None:
    """The gateway's `idle_timeout` crosses the `speak` (a stub answers the first socket's
    first `speak` with it and closes): the context's first frame says the socket is gone,
    which LiveKit retries on a fresh one with the same text, once."""
    stub = StubGateway(goodbye_first=True)
    async with stub_gateway(stub) as url, kokoro_voice.TTS(base_url=url) as engine:
        errors: list[tts.TTSError] = []
        engine.on("error", errors.append)
        async with engine.stream() as stream:  # LiveKit's default: retried
            for delta in deltas_of("Good morning.", 4):
                stream.push_text(delta)
            stream.end_input()
            again = await hear(stream)
        assert engine._connects == 2
    assert again.matches(PCM)
    assert stub.connections == 2
    assert stub.texts[stub.speaks[1]] == "Good morning."  # the whole text, sent again once
    assert [e.recoverable for e in errors] == [True]
    assert "idle_timeout" in str(errors[0].error)


async def test_text_past_the_limit_is_dropped_and_the_utterance_goes_on(
    fake_server: RunningServer, http_session: None
) -> None:
    """`text_too_long` drops one delta and keeps the utterance: the stream speaks what came
    before and ends at `agent_end`, not with an error."""
    app = create_gateway(GatewaySettings(model_server_url=fake_server.http_url, max_text_chars=20))
    with serve(app) as gw:
        async with kokoro_voice.TTS(base_url=gw.http_url) as engine:
            errors: list[tts.TTSError] = []
            engine.on("error", errors.append)
            heard = await speak(engine, ["Hello there. ", "And this is far too long to fit."])
            nxt = await speak(engine, ["See you."])  # the context ended clean, the socket stayed
            assert engine._connects == 1
    assert fake_speech(heard.pcm, ["Hello there."])
    assert [w.strip() for w in heard.words] == ["Hello", "there."]
    assert fake_speech(nxt.pcm, ["See you."])
    assert errors == []


PCM = b"\x00\x40" * 12_000  # half a second at a quarter of full scale


def audio_frame(uid: str, pcm: bytes) -> bytes:
    return bytes([len(uid)]) + uid.encode() + pcm


@dataclass
class StubGateway:
    """A speak WebSocket (protocol 2) on loopback that answers as the gateway does, with the
    moments a test needs in its hands: a reply that fails mid-way (`tts_*`, then
    `agent_end`), a first socket that says goodbye (`idle_timeout`) to its first `speak`, and
    each `cancel` answered only once `release` is set (while other contexts go on). `log`: what
    it got and sent, in order, as (direction, type, context id)."""

    fail_mid_reply: bool = False
    goodbye_first: bool = False
    cancel_seen: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled_sent: int = 0
    connections: int = 0
    speaks: list[str] = field(default_factory=list)
    texts: dict[str, str] = field(default_factory=dict)
    log: list[tuple[str, str, str | None]] = field(default_factory=list)

    async def handle(self, ws: Any) -> None:
        import orjson

        self.connections += 1
        first_socket = self.connections == 1
        cancels: set[asyncio.Task[None]] = set()
        try:
            async for raw in ws:
                message = orjson.loads(raw)
                kind, cid = message["type"], message.get("context_id")
                self.log.append(("got", kind, cid))
                if kind == "speak":
                    self.speaks.append(cid)
                    if self.goodbye_first and first_socket:
                        goodbye = {
                            "type": "error",
                            "code": "idle_timeout",
                            "message": "idle",
                            "retryable": True,
                            "status": 408,
                        }
                        await self.send(ws, goodbye)
                        await ws.close()
                        return
                    await self.send(ws, {"type": "agent_start", "context_id": cid})
                    await ws.send(audio_frame(cid, PCM))
                elif kind == "text":
                    self.texts[cid] = self.texts.get(cid, "") + message["delta"]
                elif kind == "close_context":
                    if self.fail_mid_reply:
                        error = {
                            "type": "error",
                            "code": "tts_synthesis_failed",
                            "message": "the second chunk failed",
                            "retryable": True,
                            "status": 502,
                            "context_id": cid,
                        }
                        await self.send(ws, error)
                    await self.send(ws, {"type": "agent_end", "context_id": cid})
                elif kind == "cancel":
                    self.cancel_seen.set()
                    cancels.add(asyncio.create_task(self.cancelled(ws, cid)))
        finally:
            for task in cancels:
                task.cancel()
            self.gone.set()

    async def cancelled(self, ws: Any, cid: str) -> None:
        await self.release.wait()
        self.cancelled_sent += 1
        await self.send(ws, {"type": "cancelled", "context_id": cid})

    async def send(self, ws: Any, event: dict[str, Any]) -> None:
        import orjson

        self.log.append(("sent", event["type"], event.get("context_id")))
        await ws.send(orjson.dumps(event).decode())


@contextlib.asynccontextmanager
async def stub_gateway(stub: StubGateway) -> AsyncIterator[str]:
    from websockets.asyncio.server import serve as ws_serve

    async with ws_serve(stub.handle, "127.0.0.1", 0) as server:
        port = next(iter(server.sockets)).getsockname()[1]
        yield f"http://127.0.0.1:{port}"


async def test_a_speech_error_mid_reply_is_logged_and_the_reply_ends_at_agent_end(
    http_session: None, caplog: pytest.LogCaptureFixture
) -> None:
    stub = StubGateway(fail_mid_reply=True)
    async with stub_gateway(stub) as url, kokoro_voice.TTS(base_url=url) as engine:
        errors: list[tts.TTSError] = []
        engine.on("error", errors.append)
        heard = await speak(engine, ["Hello there."])
        again = await speak(engine, ["Again."])  # agent_end came after our close_context
        assert engine._connects == 1
    assert heard.matches(PCM)
    assert again.matches(PCM)
    assert errors == []
    assert any("tts_synthesis_failed" in r.getMessage() for r in caplog.records)


async def test_closing_a_stream_does_not_wait_for_the_gateways_cancelled(
    http_session: None,
) -> None:
    """Barge-in: the stream's close returns while the gateway has not answered the cancel
    yet; the TTS reads `cancelled` in the background, the socket stays, and `TTS.aclose` ends
    a cancel still waiting and closes the socket."""
    stub = StubGateway()
    async with stub_gateway(stub) as url:
        async with kokoro_voice.TTS(base_url=url) as engine:
            stream = engine.stream(conn_options=NO_RETRY)
            stream.push_text("Hello there, and more to come ")
            await anext(stream)  # the reply plays
            await stream.aclose()  # returns with the cancel unanswered (it is held)
            await asyncio.wait_for(stub.cancel_seen.wait(), 10)
            assert stub.cancelled_sent == 0
            stub.release.set()
            await asyncio.gather(*engine._settling)
            assert stub.cancelled_sent == 1
            heard = await speak(engine, ["Next."])
            assert engine._connects == 1  # the same socket
            assert heard.matches(PCM)
        stub.release.clear()
        stub.cancel_seen.clear()
        stub.gone.clear()
        engine = kokoro_voice.TTS(base_url=url)
        stream = engine.stream(conn_options=NO_RETRY)
        stream.push_text("Hello there, and more to come ")
        await anext(stream)
        await stream.aclose()
        await asyncio.wait_for(stub.cancel_seen.wait(), 10)
        await engine.aclose()  # the cancel still waits: ended, the socket closed
        assert engine._settling == set()
        await asyncio.wait_for(stub.gone.wait(), 10)
        assert stub.cancelled_sent == 1  # the second cancel was never answered


def test_the_read_timeout_counts_from_the_last_frame_or_the_flush() -> None:
    from livekit.plugins.kokoro_voice.tts import read_deadline

    assert read_deadline(10.0, None, 5.0) is None  # the text still comes: the LLM's wait
    assert read_deadline(10.0, 3.0, 1.0) == 13.0  # flushed after the last frame
    assert read_deadline(10.0, 3.0, 7.5) == 17.5  # a frame since the flush


async def test_a_barge_in_opens_the_next_turn_before_the_old_contexts_cancelled(
    http_session: None,
) -> None:
    """The stream closed mid-turn (LiveKit's barge-in): its context is cancelled, and the next
    turn's `speak` goes out on the same socket and is spoken to its end while the gateway has
    not yet answered that cancel (the stub holds `cancelled` until released)."""
    stub = StubGateway()
    async with stub_gateway(stub) as url, kokoro_voice.TTS(base_url=url) as engine:
        old = engine.stream(conn_options=NO_RETRY)
        old.push_text("Hello there, and more to come ")
        await anext(old)  # the old turn plays
        await old.aclose()  # barge-in
        heard = await speak(engine, ["Next."])  # the whole next turn, the cancel unanswered
        assert stub.cancel_seen.is_set()
        assert stub.cancelled_sent == 0
        stub.release.set()
        await asyncio.gather(*engine._settling)
        assert stub.cancelled_sent == 1
        assert engine._connects == 1
    assert heard.matches(PCM)
    old_id, new_id = stub.speaks
    log = stub.log
    assert log.index(("got", "cancel", old_id)) < log.index(("sent", "cancelled", old_id))
    assert log.index(("got", "speak", new_id)) < log.index(("sent", "cancelled", old_id))
    assert log.index(("sent", "agent_end", new_id)) < log.index(("sent", "cancelled", old_id))
    assert stub.connections == 1


def record_wire(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str, str | None]]:
    """What the plugin's shared socket sends and the events it reads, in order, as (direction,
    type, context id)."""
    import json

    from livekit.plugins.kokoro_voice import tts as plugin_tts

    log: list[tuple[str, str, str | None]] = []
    send, on_event = plugin_tts._Socket.send, plugin_tts._Socket._on_event

    async def sending(self: Any, message: dict[str, Any]) -> None:
        log.append(("sent", message["type"], message.get("context_id")))
        await send(self, message)

    def reading(self: Any, data: str) -> None:
        event = json.loads(data)
        log.append(("got", event["type"], event.get("context_id")))
        on_event(self, data)

    monkeypatch.setattr(plugin_tts._Socket, "send", sending)
    monkeypatch.setattr(plugin_tts._Socket, "_on_event", reading)
    return log


async def test_two_turns_share_one_socket_the_second_opening_before_the_first_ends(
    gateway_on_fake: RunningServer, http_session: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two streams at once on the real gateway: the second turn's `speak` goes out while the
    first is still playing (its text not even complete), on the same socket, and each hears
    exactly its own audio and words."""
    log = record_wire(monkeypatch)
    first_text, later = "Hello there, my friend. ", "Your order shipped today."
    second_text = "Good morning."
    async with kokoro_voice.TTS(base_url=gateway_on_fake.http_url) as engine:
        first = engine.stream(conn_options=NO_RETRY)
        first.push_text(first_text)
        heard_first = Heard()
        heard_first.add(await anext(first))  # the first turn plays
        second = engine.stream(conn_options=NO_RETRY)
        for delta in deltas_of(second_text, 4):
            second.push_text(delta)
        second.end_input()
        heard_second = await hear(second)  # the whole second turn, the first still open
        first.push_text(later)
        first.end_input()
        async for event in first:
            heard_first.add(event)
        await first.aclose()
        await second.aclose()
        assert engine._connects == 1
    speaks = [cid for way, kind, cid in log if (way, kind) == ("sent", "speak")]
    assert len(speaks) == 2
    one, two = speaks
    assert log.index(("sent", "speak", two)) < log.index(("got", "agent_end", one))
    assert log.index(("got", "agent_end", two)) < log.index(("sent", "close_context", one))
    assert fake_speech(heard_first.pcm, [first_text.strip(), later])
    assert fake_speech(heard_second.pcm, [second_text])
    assert [w.strip() for w in heard_second.words] == ["Good", "morning."]
    assert_aligned(heard_first.words, first_text + later)
