"""Property-based tests of the gateway's public routes on a real server (the fake engine behind
it): whatever a client sends, it gets a reply or a clean error with a documented code, never a
500, a traceback or a WebSocket closed with 1011; the session stays usable; and when the
client is gone, no session, reply or model-server session is left open.

Clients are synchronous (httpx, websockets.sync): each example is one session, in step with
the server, so no test waits on time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from gateway.sources.sse import SSEDecoder
from gateway.speak_ws.protocol import Cancel, Invalid, Speak, parse_client_message
from model_server.drain import wait_drained
from tests.support.servers import RunningServer, serve

# every code a client of the public routes can be told about (docs/protocols.md)
ERROR_CODES = frozenset(
    {
        "invalid_json",
        "not_an_object",
        "unknown_type",
        "invalid_field",
        "missing_text",
        "empty_text",
        "text_too_long",
        "busy",
        "no_open_utterance",
        "nothing_to_cancel",
        "binary_frame",
        "overloaded",
        "rate_limited",
        "too_many_sessions",
        "tts_unknown_voice",
        "unknown_voice",
        "tts_text_too_long",
        "tts_unreadable_text",
        "tts_invalid_field",
        "unsupported_media_type",
        "body_too_large",
        "not_found",
        "method_not_allowed",
        "origin_not_allowed",
        "invalid_markup",
        "invalid_ipa",
        "pause_too_long",
        "tts_invalid_markup",
        "tts_invalid_ipa",
        "tts_pause_too_long",
        "unknown_lexicon",
        "tts_invalid_lexicon",
        "tts_lexicon_too_large",
    }
)
MAX_TEXT = 120
FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
SPEAK_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "text": st.text(max_size=MAX_TEXT + 20) | JSON_VALUES,
    "prompt": st.text(max_size=40) | JSON_VALUES,
    "mode": st.sampled_from(["bidi", "batch", "turbo"]) | JSON_VALUES,
    "format": st.sampled_from(["pcm", "mp3", "wav", "aiff"]) | JSON_VALUES,
    "voice": st.sampled_from(["af_test", "nobody"]) | JSON_VALUES,
    "speed": st.floats(0, 3) | JSON_VALUES,
    "echo_tps": st.floats(0, 2000) | JSON_VALUES,
    "utterance_id": st.text(max_size=70) | JSON_VALUES,
}

# bodies that are mostly replies (their events are what `check_reply` checks), with what can
# still fail inside one: an unknown voice, a format, a speed, a batch reply
REPLIES = st.fixed_dictionaries(
    {"text": st.sampled_from(["Hello there.", "One, two, three.", "Okay"])},
    optional={
        "mode": st.sampled_from(["bidi", "batch"]),
        "format": st.sampled_from(["pcm", "mp3", "wav", "opus", "aac"]),
        "voice": st.sampled_from(["af_test", "jf_alpha", "nobody"]),
        "speed": st.floats(0.5, 2.0),
        "echo_tps": st.sampled_from([50, 400]),
    },
)


@dataclass(frozen=True)
class Step:
    frame: str | bytes
    speaks: bool = False  # a speak: its reply (or its refusal) comes back whole


GOOD_SPEAKS = st.builds(
    lambda text, fmt: Step(
        orjson.dumps({"type": "speak", "text": text, "format": fmt}).decode(), speaks=True
    ),
    st.sampled_from(["Hello there.", "One, two, three.", "Okay"]),
    st.sampled_from(["pcm", "mp3", "opus"]),
)
ANY_SPEAKS = st.fixed_dictionaries({}, optional=SPEAK_FIELDS).map(
    lambda fields: Step(json.dumps({"type": "speak", **fields}), speaks=True)
)
OTHERS = st.one_of(
    st.sampled_from(['{"type": "cancel"}', '{"type": "flush"}', '{"type": "text", "delta": "x"}']),
    st.builds(lambda d: json.dumps({"type": "text", "delta": d}), JSON_VALUES),
    st.builds(lambda t: json.dumps({"type": t}), JSON_VALUES),
    JSON_VALUES.map(json.dumps),
    st.text(max_size=30).map(lambda s: "{not json " + s),
).map(Step)
BINARY = st.binary(max_size=50).map(Step)
SESSIONS = st.lists(st.one_of(GOOD_SPEAKS, ANY_SPEAKS, OTHERS, BINARY), min_size=1, max_size=6)


@pytest.fixture(scope="module")
def gateway(fake_server: RunningServer) -> Iterator[RunningServer]:
    settings = GatewaySettings(
        model_server_url=fake_server.http_url,
        max_text_chars=MAX_TEXT,
        replies_per_minute=0,  # the fuzzer sends many
        llm_tokens_per_minute=0,
    )
    with serve(create_gateway(settings)) as running:
        yield running


def answer_of(ws: ClientConnection, step: Step) -> list[dict[str, Any]]:
    """Send `step` and read what it brings back, as the pure parser predicts: an invalid frame
    one error with its code; a speak a whole reply up to `agent_end` (a speak that waits for
    the client's own text is given a flush) or one error when it is refused (and then one
    `no_open_utterance` for that flush)."""
    ws.send(step.frame)
    message = parse_client_message(step.frame if isinstance(step.frame, str) else None)
    if isinstance(message, Invalid):
        (event,) = read_until(ws, lambda e: e["type"] == "error")
        assert event["code"] == message.error.code, (event, message)
        return [event]
    if not isinstance(message, Speak):
        (event,) = read_until(ws, lambda e: e["type"] == "error")  # no utterance is open
        expected = "nothing_to_cancel" if isinstance(message, Cancel) else "no_open_utterance"
        assert event["code"] == expected, event
        return [event]
    client_text = message.params.text is None and message.params.prompt is None
    if client_text:
        ws.send('{"type": "flush"}')  # the client's own text: none
    events = read_until(ws, lambda e: e["type"] == "agent_end" or e.get("utterance_id") is None)
    if events[0]["type"] == "error":  # refused before it started (its text, its voice)
        assert len(events) == 1
        if client_text:  # and so the flush found no utterance open (docs/protocols.md)
            (stray,) = read_until(ws, lambda e: e["type"] == "error")
            assert stray["code"] == "no_open_utterance", stray
            events.append(stray)
    return events


def read_until(ws: ClientConnection, last: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    while True:
        frame = ws.recv(timeout=30)
        if isinstance(frame, bytes):
            continue
        events.append(orjson.loads(frame))
        if last(events[-1]) or (events[-1]["type"] == "error" and len(events) == 1):
            return events


def check(events: list[dict[str, Any]]) -> None:
    for event in events:
        if event["type"] == "error":
            assert event["code"] in ERROR_CODES, event
            assert "Traceback" not in event["message"]
            assert isinstance(event["retryable"], bool)


def check_reply(body: bytes) -> None:
    """A 200 SSE reply, decoded: one whole reply that ends with `agent_end`, any error in it
    one of the documented codes (checked as the WebSocket's are, so never `internal_error`)
    and the last event before `agent_end`."""
    decoder = SSEDecoder()
    events = [{**orjson.loads(e.data), "type": e.event} for e in decoder.push(body)]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "agent_start", kinds
    assert kinds[-1] == "agent_end", kinds
    assert kinds.count("agent_end") == 1, kinds
    assert kinds.count("error") <= 1, kinds
    if "error" in kinds:
        assert kinds[-2] == "error", kinds
    check(events)


@FUZZ
@given(steps=SESSIONS)
# a speak for the client's own text, refused: the flush sent after it is answered too
@example(steps=[Step('{"type": "speak", "voice": "nobody"}', speaks=True), Step('{"type": "x"}')])
def test_websocket_sessions_survive_any_frames(
    gateway: RunningServer, fake_server: RunningServer, steps: list[Step]
) -> None:
    with connect(gateway.ws_url + "/v1/speak/ws") as ws:
        for step in steps:
            check(answer_of(ws, step))
        # whatever came before, a good speak still gets its reply, and close still closes
        events = answer_of(ws, Step('{"type": "speak", "text": "Still here.", "format": "pcm"}'))
        assert [e["type"] for e in events][-1] == "agent_end"
        ws.send('{"type": "close"}')
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1000
    assert wait_drained(fake_server.http_url, 10, 0.02) == 0


@FUZZ
@given(body=REPLIES | st.fixed_dictionaries({}, optional=SPEAK_FIELDS) | JSON_VALUES)
def test_post_speak_answers_a_reply_or_a_clean_error(gateway: RunningServer, body: Any) -> None:
    with httpx.Client(base_url=gateway.http_url, timeout=30) as http:
        r = http.post(
            "/v1/speak", content=json.dumps(body), headers={"Content-Type": "application/json"}
        )
    if r.status_code == 200:
        check_reply(r.content)
        return
    assert 400 <= r.status_code < 500, r.text
    error = r.json()["error"]
    assert error["code"] in ERROR_CODES, error
    assert "Traceback" not in r.text


@FUZZ
@given(
    query=REPLIES.map(lambda fields: {k: str(v) for k, v in fields.items()})
    | st.dictionaries(st.sampled_from(sorted(SPEAK_FIELDS)), st.text(max_size=30), max_size=5)
)
def test_sse_query_answers_a_reply_or_a_clean_error(
    gateway: RunningServer, query: dict[str, str]
) -> None:
    with httpx.Client(base_url=gateway.http_url, timeout=30) as http:
        r = http.get("/v1/speak/sse", params=query)
    if r.status_code == 200:
        check_reply(r.content)
        return
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["error"]["code"] in ERROR_CODES


# --- schemathesis against the published OpenAPI schema ------------------------------------------

OPENAPI = create_gateway(GatewaySettings()).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI)


def test_the_schema_tested_is_the_one_served(gateway: RunningServer) -> None:
    assert httpx.get(gateway.internal_url + "/openapi.json").json() == OPENAPI  # not public
    assert {"/v1/speak", "/v1/speak/sse", "/v1/audio/speech", "/v1/tokens"} <= set(OPENAPI["paths"])


@schema.parametrize()
@settings(max_examples=15, deadline=None, database=None)
def test_routes_keep_their_openapi_contract(case: Case[Any], gateway: RunningServer) -> None:
    case.call_and_validate(
        base_url=gateway.http_url,
        checks=[not_a_server_error, status_code_conformance, content_type_conformance],
    )
