"""The voice a request names, on every route of the gateway: the model servers' own names,
OpenAI's names through the voice table (what the frameworks' OpenAI classes send), and any
other name refused with `400 unknown_voice` before a stream starts."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.errors import BadRequest, TTSError
from gateway.service.voices import NAMESAKES, OPENAI_VOICES, VoiceCatalog, parse_table
from tests.support.gateway_client import ws_reply_audio
from tests.support.servers import RunningServer

LOADED = {"voices": [{"name": "jm_kumo"}, {"name": "af_alloy"}]}


class Voices:
    """The model servers' GET /voices as the catalog sees it; counts the asks."""

    def __init__(self, answer: dict[str, Any] | None) -> None:
        self.answer = answer
        self.asked = 0

    async def __call__(self) -> dict[str, Any]:
        self.asked += 1
        if self.answer is None:
            raise TTSError("model server unreachable")
        return self.answer


async def test_names_resolve_to_loaded_voices_or_the_default() -> None:
    voices = Voices(LOADED)
    catalog = VoiceCatalog(voices, parse_table(""), clock=lambda: 0.0)
    assert await catalog.resolve(None) is None
    assert await catalog.resolve("jm_kumo") == "jm_kumo"
    assert await catalog.resolve("alloy") == "af_alloy"  # Kokoro's namesake, loaded
    assert await catalog.resolve("echo") is None  # its namesake is not loaded: the default
    assert await catalog.resolve("marin") is None  # no namesake: the default
    with pytest.raises(BadRequest) as unknown:
        await catalog.resolve("af_nope")
    assert unknown.value.code == "unknown_voice"
    assert unknown.value.status == 400
    assert "af_alloy, jm_kumo" in unknown.value.message
    assert "cedar" in unknown.value.message
    assert "marin" in unknown.value.message
    assert voices.asked == 1  # asked once within refresh_s


async def test_the_table_and_what_happens_when_voices_cannot_be_asked() -> None:
    table = parse_table("marin=jm_kumo, alloy=jm_kumo")
    catalog = VoiceCatalog(Voices(LOADED), table)
    assert await catalog.resolve("marin") == "jm_kumo"
    assert await catalog.resolve("alloy") == "jm_kumo"  # the operator's entry wins
    assert table["echo"] == NAMESAKES["echo"]
    with pytest.raises(ValueError, match="not one of OpenAI's voices"):
        parse_table("jm_kumo=af_heart")
    with pytest.raises(ValueError, match="is not name=voice"):
        parse_table("alloy")
    unreachable = VoiceCatalog(Voices(None))
    assert await unreachable.resolve("af_whatever") == "af_whatever"  # the model server decides
    assert await unreachable.resolve("alloy") is None
    sagemaker = VoiceCatalog(Voices({"default": "", "voices": []}))  # an endpoint lists none
    assert await sagemaker.resolve("af_whatever") == "af_whatever"
    assert set(OPENAI_VOICES) >= {"alloy", "cedar", "marin", "verse"}


async def test_the_listing_is_the_last_answer_while_the_servers_cannot_be_asked() -> None:
    """`GET /v1/voices` asks at most every `refresh_s`; a failed ask keeps the last answer
    (a picker never empties because a server was slow for a moment); with none yet, the
    servers' error, asked again on every call."""
    now = [0.0]
    voices = Voices(LOADED)
    catalog = VoiceCatalog(voices, clock=lambda: now[0])
    assert await catalog.listing() == LOADED
    assert await catalog.listing() == LOADED
    assert voices.asked == 1  # within refresh_s
    voices.answer = None  # the servers stop answering
    now[0] = 30.0
    assert await catalog.listing() == LOADED  # the last answer stands
    assert voices.asked == 2
    assert await catalog.resolve("jm_kumo") == "jm_kumo"  # and resolves names as before
    voices.answer = {"voices": [{"name": "af_heart"}]}
    now[0] = 60.0
    assert await catalog.listing() == {"voices": [{"name": "af_heart"}]}  # a new answer wins
    assert await catalog.resolve("af_heart") == "af_heart"
    never = Voices(None)
    unreachable = VoiceCatalog(never, clock=lambda: 0.0)
    for asked in (1, 2):
        with pytest.raises(TTSError):
            await unreachable.listing()
        assert never.asked == asked
    unreadable = VoiceCatalog(Voices({"voices": "af_heart"}), clock=lambda: 0.0)
    assert await unreadable.listing() == {"voices": "af_heart"}  # as it came
    assert await unreadable.known() is None


async def test_openai_route_takes_openai_names_and_refuses_others_before_streaming(
    gateway_on_fake: RunningServer,
) -> None:
    client = openai.AsyncOpenAI(base_url=gateway_on_fake.http_url + "/v1", api_key="unused")
    for voice in ("marin", "cedar", "alloy", "af_test"):
        speech = await client.audio.speech.create(
            model="kokoro", voice=voice, input="Hello there.", response_format="pcm"
        )
        assert len(speech.content) > 0, voice
    with pytest.raises(openai.BadRequestError) as refused:
        await client.audio.speech.create(model="kokoro", voice="af_nope", input="Hello there.")
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "unknown_voice"
    assert "af_test, jf_alpha" in error["message"]
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        body = {"input": "Hi.", "voice": "af_nope", "stream_format": "sse"}
        sse = await http.post("/v1/audio/speech", json=body)
    assert sse.status_code == 400  # not a 200 with an in-band error
    assert sse.json()["error"]["code"] == "unknown_voice"


async def test_speak_routes_refuse_an_unknown_voice_before_streaming(
    gateway_on_fake: RunningServer,
) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        get = await http.get("/v1/speak/sse", params={"text": "Hi.", "voice": "af_nope"})
        post = await http.post("/v1/speak", json={"text": "Hi.", "voice": "af_nope"})
        for refused in (get, post):
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "unknown_voice"
        fine = await http.get("/v1/speak/sse", params={"text": "Hi.", "voice": "nova"})
        assert fine.status_code == 200
        assert "event: audio_chunk" in fine.text
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        await ws.send(orjson.dumps({"type": "speak", "text": "Hi.", "voice": "af_nope"}).decode())
        error = orjson.loads(await ws.recv())
        assert (error["type"], error["code"]) == ("error", "unknown_voice")
        await ws.send(orjson.dumps({"type": "speak", "text": "Hi.", "voice": "af_test"}).decode())
        audio, end = await ws_reply_audio(ws)  # the session goes on
        assert len(audio) > 0
        assert end["type"] == "agent_end"
