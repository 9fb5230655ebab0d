"""A request's `language` through every gateway route to the model server's G2P: the real
gateway in front of the real model-server app, whose G2P is the real `LanguageG2P` with each
language's reader a stand-in that marks what it read (`<es>Hola.`), over the fake engine, which
keeps the phonemes it was given. An unknown language is refused before anything is voiced.
The real readers' phonemes are tests/model_server/text/test_g2p.py's and test_real_model.py's."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from kokoro_contract import languages
from model_server.app import create_app as create_model_server
from model_server.text.g2p import AS_WRITTEN, LanguageG2P
from tests.support.fakes import FAKE_SETTINGS, FakeEngine, IdentityG2P
from tests.support.gateway_client import sse_get, sse_post, ws_events, ws_reply_audio
from tests.support.servers import RunningServer, serve

TEXT = "Hola, buenos dias."


class _Marking:
    """A language's reader that says which it is: `<es>` before the text."""

    def __init__(self, language: str) -> None:
        self.name = f"marking-{language}"
        self._mark = f"<{language}>"

    def __call__(self, text: str) -> str:
        return self._mark + text.strip()


def _marking_g2p() -> LanguageG2P:
    def maker(name: str) -> Callable[[], _Marking]:
        return lambda: _Marking(name)

    others = [lang.name for lang in languages.LANGUAGES if lang is not languages.ENGLISH]
    makers = {name: maker(name) for name in others}
    makers["en-us" + AS_WRITTEN] = maker("as-written")  # English with normalize off
    return LanguageG2P(IdentityG2P(), makers)


@pytest.fixture(scope="module")
def stack() -> Iterator[tuple[RunningServer, FakeEngine]]:
    engine = FakeEngine()
    model = create_model_server(
        FAKE_SETTINGS, engine_factory=lambda _: engine, g2p_factory=_marking_g2p
    )
    with contextlib.ExitStack() as stack:
        model_server = stack.enter_context(serve(model))
        assert model.state.service.settled.wait(timeout=10)
        settings = GatewaySettings(
            model_server_url=model_server.http_url, replies_per_minute=0, admission=False
        )
        yield stack.enter_context(serve(create_gateway(settings))), engine


async def _sse_get(gateway: RunningServer, **params: Any) -> None:
    reply = await sse_get(gateway.http_url, {"text": TEXT, "format": "pcm", **params})
    assert reply.names[-1] == "agent_end", reply.names


async def _sse_post(gateway: RunningServer, **params: Any) -> None:
    reply = await sse_post(gateway.http_url, {"text": TEXT, "format": "pcm", **params})
    assert reply.names[-1] == "agent_end", reply.names


async def _websocket(gateway: RunningServer, **params: Any) -> None:
    async with connect(gateway.ws_url + "/v1/speak/ws") as ws:
        speak = {"type": "speak", "text": TEXT, "format": "pcm", **params}
        await ws.send(orjson.dumps(speak).decode())
        audio, end = await ws_reply_audio(ws)
    assert len(audio) == end["metrics"]["audio_bytes"] > 0


async def _openai(gateway: RunningServer, **params: Any) -> None:
    body = {"model": "kokoro", "input": TEXT, "response_format": "pcm", **params}
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http:
        response = await http.post("/v1/audio/speech", json=body)
    assert response.status_code == 200, response.text
    assert len(response.content) > 0


async def _agentcore(gateway: RunningServer, **params: Any) -> None:
    body = {"text": TEXT, "format": "pcm", **params}
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http:
        response = await http.post("/invocations", json=body)
    assert response.status_code == 200, response.text
    assert "agent_end" in response.text


ROUTES = {
    "sse-get": _sse_get,
    "sse-post": _sse_post,
    "websocket": _websocket,
    "openai": _openai,
    "agentcore": _agentcore,
}


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("asked", "mark"),
    [
        ({"language": "e"}, "<es>"),
        ({"language": "pt-br"}, "<pt-br>"),
        ({"language": "zh"}, "<zh>"),
        ({}, ""),
        ({"normalize": "off"}, "<as-written>"),
        ({"normalize": "on"}, ""),
        ({"language": "es", "normalize": "off"}, "<es>"),  # its reader keeps its own rules
    ],
    ids=str,
)
async def test_each_route_reads_the_text_as_asked(
    stack: tuple[RunningServer, FakeEngine], route: str, asked: dict[str, str], mark: str
) -> None:
    gateway, engine = stack
    engine.reset()
    params = dict(asked)
    if route == "openai":
        params["voice"] = ""  # the model server's default, not OpenAI's alloy mapped
    await ROUTES[route](gateway, **params)
    assert engine.calls, "nothing was voiced"
    # every chunk the model server voiced was read by that language's reader (and with no
    # language, a Latin text by the English one, the identity here)
    assert all(call.startswith(mark) and "<" not in call[len(mark) :] for call in engine.calls)
    assert "".join(call[len(mark) :] for call in engine.calls).replace(" ", "") == TEXT.replace(
        " ", ""
    )


async def test_an_unknown_language_or_normalisation_is_refused_before_any_audio(
    stack: tuple[RunningServer, FakeEngine],
) -> None:
    gateway, engine = stack
    engine.reset()
    async with httpx.AsyncClient(base_url=gateway.http_url, timeout=30) as http:
        sse = await http.get("/v1/speak/sse", params={"text": TEXT, "language": "klingon"})
        openai = await http.post(
            "/v1/audio/speech", json={"input": TEXT, "language": "klingon", "voice": ""}
        )
        agentcore = await http.post("/invocations", json={"text": TEXT, "language": "xx"})
        maybe = await http.post("/v1/speak", json={"text": TEXT, "normalize": "maybe"})
    for response in (sse, openai, agentcore):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["code"] == "unknown_language"
        assert "en-us (a)" in error["message"]  # it names those there are
    assert maybe.status_code == 400
    assert maybe.json()["error"]["code"] == "invalid_field"
    assert "'auto', 'on' or 'off'" in maybe.json()["error"]["message"]
    async with connect(gateway.ws_url + "/v1/speak/ws") as ws:
        await ws.send(orjson.dumps({"type": "speak", "text": TEXT, "language": 5}).decode())
        refusal = orjson.loads(await ws.recv())
        assert (refusal["type"], refusal["code"]) == ("error", "invalid_field")
        # the session goes on
        await ws.send(orjson.dumps({"type": "speak", "text": TEXT, "format": "pcm"}).decode())
        audio, events = await ws_events(ws)
    assert events[-1]["type"] == "agent_end"
    assert audio
    assert all(not call.startswith("<") for call in engine.calls)  # only the last, in English
