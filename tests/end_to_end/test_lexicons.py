"""Pronunciation lexicons through the gateway (issue #51), over the fake engine and the identity
G2P (the engine's calls are the phonemes it was given): a client's lexicon, saved, listed,
versioned and deleted, read on every route that names it; a reply keeps the version it began
with; the deployment's `--lexicon-file` is read on every reply; limits and bad lexicons are
clear errors. The lexicon's rules: tests/kokoro_contract/test_lexicon.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from kokoro_contract.lexicon import MAX_ENTRIES
from tests.support.fakes import FakeEngine
from tests.support.gateway_client import read_sse, sse_post, ws_reply_audio
from tests.support.servers import RunningServer, serve

V1 = {"kokoro": "/kˈOkəɹO/", "SQL": "sequel"}
V2 = {"kokoro": "/kˈʌkʌɹʌ/"}


async def _put(http: httpx.AsyncClient, name: str, entries: Any) -> httpx.Response:
    return await http.put(f"/v1/lexicons/{name}", json={"entries": entries})


async def test_a_clients_lexicon_is_saved_listed_read_on_every_route_and_deleted(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    text = "Kokoro runs SQL."
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, timeout=30) as http:
        saved = await _put(http, "names-a", V1)
        assert saved.status_code == 200, saved.text
        assert saved.json() == {"name": "names-a", "version": 1, "entries": 2}
        listed = (await http.get("/v1/lexicons")).json()
        assert {"name": "names-a", "version": 1, "entries": 2} in listed["lexicons"]
        assert (await http.get("/v1/lexicons/names-a")).json()["entries"] == V1
        asks = [
            http.get("/v1/speak/sse", params={"text": text, "lexicon": "names-a"}),
            http.post("/v1/speak", json={"text": text, "lexicon": "names-a"}),
            http.post("/v1/audio/speech", json={"input": text, "lexicon": "names-a", "voice": ""}),
            http.post("/invocations", json={"text": text, "lexicon": "names-a"}),
        ]
        for ask in asks:
            answer = await ask
            assert answer.status_code == 200, answer.text
    async with connect(gateway_on_fake.ws_url + "/v1/speak/ws") as ws:
        speak = {"type": "speak", "text": text, "format": "pcm", "lexicon": "names-a"}
        await ws.send(orjson.dumps(speak).decode())
        await ws_reply_audio(ws)
    assert fake_engine.calls == ["kˈOkəɹO runs sequel."] * 5
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, timeout=30) as http:
        assert (await http.delete("/v1/lexicons/names-a")).status_code == 204
        assert (await http.delete("/v1/lexicons/names-a")).status_code == 404
        gone = await http.post("/v1/speak", json={"text": text, "lexicon": "names-a"})
    assert gone.status_code == 400
    assert gone.json()["error"]["code"] == "unknown_lexicon"


async def test_a_reply_keeps_the_version_it_began_with(
    gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    text = "Kokoro is here, my good friend. And Kokoro is here again for you. Kokoro says bye."
    body = {"text": text, "format": "pcm", "lexicon": "names-b", "echo_tps": 30}
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, timeout=30) as http:
        assert (await _put(http, "names-b", V1)).status_code == 200
        async with http.stream("POST", "/v1/speak", json=body) as reply:
            lines = reply.aiter_lines()
            async for line in lines:  # the first chunk is voiced: the reply is under way
                if line.startswith("event: audio_chunk"):
                    break
            assert (await _put(http, "names-b", V2)).json()["version"] == 2
            rest = [line async for line in lines]
        assert "event: agent_end" in rest
        assert len(fake_engine.calls) >= 2
        assert all("kˈOkəɹO" in call for call in fake_engine.calls)  # v1 to the end
        fake_engine.reset()
        await sse_post(gateway_on_fake.http_url, {"text": "Kokoro.", "lexicon": "names-b"})
        assert fake_engine.calls == ["kˈʌkʌɹʌ."]
        await http.delete("/v1/lexicons/names-b")


@pytest.mark.parametrize(
    ("entries", "status", "code"),
    [
        ({"word": "/wˈɜʘd/"}, 400, "invalid_ipa"),
        ({"a<b": "x"}, 400, "invalid_lexicon"),
        ({f"w{i}": "x" for i in range(MAX_ENTRIES + 1)}, 400, "lexicon_too_large"),
        ({f"word{i}": "x" * 20 for i in range(100_000)}, 413, "body_too_large"),
    ],
    ids=["ipa", "key", "entries", "bytes"],
)
async def test_bad_or_huge_lexicons_are_refused(
    gateway_on_fake: RunningServer, entries: dict[str, str], status: int, code: str
) -> None:
    async with httpx.AsyncClient(base_url=gateway_on_fake.http_url, timeout=30) as http:
        answer = await _put(http, "bad", entries)
        assert answer.status_code == status
        assert answer.json()["error"]["code"] == code
        assert (await http.get("/v1/lexicons/bad")).status_code == 404  # nothing kept


async def test_the_deployments_lexicon_is_read_on_every_reply(
    fake_server: RunningServer, fake_engine: FakeEngine, tmp_path: Path
) -> None:
    path = tmp_path / "names.json"
    path.write_text(json.dumps({"kokoro": "/kˈOkəɹO/", "SQL": "sequel"}), encoding="utf-8")
    settings = GatewaySettings(
        model_server_url=fake_server.http_url,
        replies_per_minute=0,
        admission=False,
        lexicon_file=path,
    )
    with serve(create_gateway(settings)) as gateway:
        async with httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http:
            assert (await http.get("/v1/lexicons")).json()["deployment"] == {
                "name": "names",
                "version": 1,
                "entries": 2,
            }
            await _put(http, "mine", {"SQL": "/ˈɛs kjˈu ˈɛl/"})
            async with http.stream("POST", "/v1/speak", json={"text": "Kokoro runs SQL."}) as r:
                await read_sse(r)
            async with http.stream(
                "POST", "/v1/speak", json={"text": "Kokoro runs SQL.", "lexicon": "mine"}
            ) as r:
                await read_sse(r)
    # its own entries on top of the deployment's
    assert fake_engine.calls == ["kˈOkəɹO runs sequel.", "kˈOkəɹO runs ˈɛs kjˈu ˈɛl."]
    path.write_text('{"kokoro": "/kˈOʘ/"}', encoding="utf-8")
    with pytest.raises(ValueError, match=r"names\.json") as caught:
        create_gateway(GatewaySettings(model_server_url=fake_server.http_url, lexicon_file=path))
    assert "U+0298" in str(caught.value)
