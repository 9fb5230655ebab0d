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
from gateway.service.voices import (
    NAMESAKES,
    OPENAI_VOICES,
    SavedBlends,
    VoiceCatalog,
    parse_table,
)
from tests.support.fakes import FakeEngine
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


# --- blends ---------------------------------------------------------------------------------


async def test_a_blend_resolves_to_its_canonical_name_against_the_servers_voices() -> None:
    catalog = VoiceCatalog(Voices(LOADED), parse_table(""), clock=lambda: 0.0)
    assert await catalog.resolve("jm_kumo(2)+af_alloy(1)") == "af_alloy(1)+jm_kumo(2)"
    assert await catalog.resolve(["jm_kumo", "af_alloy"]) == "af_alloy(1)+jm_kumo(1)"
    asked: list[str] = []

    async def saved() -> dict[str, str]:
        asked.append("saved")
        return {"warm": "af_alloy(1)+jm_kumo(2)"}

    assert await catalog.resolve("warm", saved) == "af_alloy(1)+jm_kumo(2)"  # a saved name
    # a voice, an OpenAI name or a blend never asks for the client's saved ones (a round trip
    # to a fleet's Redis)
    for voice in ("jm_kumo", "alloy", "jm_kumo+af_alloy"):
        await catalog.resolve(voice, saved)
    assert asked == ["saved"]
    for bad, code in [
        ("jm_kumo+af_nope", "unknown_voice"),
        ("jm_kumo(0)+af_alloy", "invalid_voice"),
    ]:
        with pytest.raises(BadRequest) as refused:
            await catalog.resolve(bad)
        assert (refused.value.code, refused.value.status) == (code, 400)
    unknown = VoiceCatalog(Voices(None), parse_table(""))  # the servers cannot be asked
    assert await unknown.resolve("x_a(1)+x_b(3)") == "x_a(1)+x_b(3)"  # their check, then


async def test_saved_blends_are_bounded_per_client_and_in_all() -> None:
    saved = SavedBlends(per_client=2, total=3)
    await saved.save("a", "one", "x(1)+y(1)", None)
    await saved.save("a", "two", "x(1)+y(2)", None)
    await saved.save("a", "two", "x(1)+y(3)", None)  # the same name again: replaced, not counted
    with pytest.raises(BadRequest, match="this client has 2 saved blends") as per_client:
        await saved.save("a", "three", "x(1)+y(1)", None)
    assert per_client.value.code == "too_many_blends"
    await saved.save("b", "one", "x(1)+y(1)", None)
    with pytest.raises(BadRequest, match="this gateway keeps") as in_all:
        await saved.save("c", "one", "x(1)+y(1)", None)
    assert in_all.value.code == "too_many_blends"
    assert await saved.delete("b", "one")
    assert not await saved.delete("b", "one")
    await saved.save("c", "one", "x(1)+y(1)", None)  # room again
    assert await saved.of("a") == {"one": "x(1)+y(1)", "two": "x(1)+y(3)"}
    assert await saved.of("b") == {}


async def test_a_saved_blend_speaks_on_every_route_for_its_client_only(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        saved = await http.post(
            "/v1/voices", json={"name": "warm-1", "blend": "jf_alpha(1)+af_test(2)"}
        )
        assert saved.status_code == 201, saved.text
        assert saved.json() == {"name": "warm-1", "blend": "af_test(2)+jf_alpha(1)"}
        listing = (await http.get("/v1/voices")).json()
        assert {"name": "warm-1", "blend": "af_test(2)+jf_alpha(1)"} in listing["blends"]
        try:
            fake_engine.reset()
            sse = await http.get("/v1/speak/sse", params={"text": "Hi.", "voice": "warm-1"})
            assert "event: audio_chunk" in sse.text
            speech = await http.post(
                "/v1/audio/speech",
                json={"input": "Hi.", "voice": "warm-1", "response_format": "pcm"},
            )
            assert speech.status_code == 200
            assert len(speech.content) > 0
            listed = await http.post(
                "/v1/speak",
                json={"text": "Hi.", "voice": ["af_test(2)", "jf_alpha"], "format": "pcm"},
            )
            assert "event: audio_chunk" in listed.text
            # every call the model server made was in the blend, by its canonical name
            assert fake_engine.voices_called
            assert set(fake_engine.voices_called) == {"af_test(2)+jf_alpha(1)"}
        finally:
            deleted = await http.delete("/v1/voices/warm-1")
        assert deleted.status_code == 204
        assert (await http.delete("/v1/voices/warm-1")).status_code == 404
        gone = await http.get("/v1/speak/sse", params={"text": "Hi.", "voice": "warm-1"})
        assert gone.status_code == 400
        assert gone.json()["error"]["code"] == "unknown_voice"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"name": "Warm", "blend": "jf_alpha+af_test"}, "invalid_field"),  # capitals
        ({"name": "jf_alpha", "blend": "jf_alpha+af_test"}, "invalid_field"),  # a voice's name
        ({"name": "alloy", "blend": "jf_alpha+af_test"}, "invalid_field"),  # OpenAI's
        ({"name": "w", "blend": "jf_alpha"}, "invalid_field"),  # one voice is no blend
        ({"name": "w", "blend": ""}, "invalid_field"),
        ({"name": "w", "blend": "jf_alpha+nobody"}, "unknown_voice"),
        ({"name": "w", "blend": "jf_alpha(0)+af_test"}, "invalid_voice"),
        ({"name": "w", "blend": "jf_alpha+af_test", "extra": 1}, "invalid_field"),
    ],
)
async def test_a_bad_blend_to_save_is_refused(
    gateway_on_fake: RunningServer, body: dict[str, Any], code: str
) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        refused = await http.post("/v1/voices", json=body)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == code
        assert body.get("name") not in {
            b["name"] for b in (await http.get("/v1/voices")).json()["blends"]
        }


async def test_a_blend_with_an_unknown_part_is_refused_on_every_route(
    gateway_on_fake: RunningServer,
) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url) as http:
        sse = await http.get("/v1/speak/sse", params={"text": "Hi.", "voice": "jf_alpha+nobody"})
        speech = await http.post(
            "/v1/audio/speech", json={"input": "Hi.", "voice": "x(1)+jf_alpha"}
        )
        for refused in (sse, speech):
            assert refused.status_code == 400
            assert refused.json()["error"]["code"] == "unknown_voice"
            assert "nobody" in refused.text or "'x'" in refused.text
