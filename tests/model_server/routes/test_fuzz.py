"""Property-based tests of the model server's routes, on a real server over the fake engine:
whatever arrives at `POST /invocations` or on the WebSocket, the answer is audio of exactly the
right length or a clean error with a documented code (never a 500, a traceback, a dropped
connection or a 1011 close), the session stays usable, the engine runs exactly what was asked
and nothing stays in flight afterwards. Then schemathesis against the OpenAPI schema the server
publishes.

Clients are synchronous (httpx, websockets.sync): each example is one request or one session,
in step with the server, so no test waits on time.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import Case
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from websockets.exceptions import ConnectionClosedOK
from websockets.sync.client import ClientConnection, connect

from kokoro_contract import blends, formats
from kokoro_contract.protocol import parse_words
from model_server.app import create_app
from model_server.config import Settings
from model_server.drain import wait_drained
from model_server.text.split import split_phonemes
from tests.conftest import FAKE_SETTINGS
from tests.support.fakes import FakeEngine, expected_pcm_bytes
from tests.support.servers import RunningServer

BIDI = "/invocations-bidirectional-stream"
MAX_TEXT_CHARS = FAKE_SETTINGS.max_text_chars
VOICES = ("af_test", "jf_alpha")  # what FakeEngine loads
# every code docs/protocols.md lists for the model server
ERROR_CODES = frozenset(
    {
        "invalid_utf8",
        "invalid_json",
        "not_an_object",
        "missing_text",
        "empty_text",
        "text_too_long",
        "unknown_voice",
        "invalid_voice",
        "invalid_speed",
        "unknown_language",
        "invalid_markup",
        "invalid_ipa",
        "pause_too_long",
        "invalid_lexicon",
        "lexicon_too_large",
        "invalid_field",
        "unknown_type",
        "duplicate_request_id",
        "too_many_pending",
        "unknown_request_id",
        "not_ready",
        "synthesis_failed",
        "unreadable_text",
        "unsupported_format",
        "internal_error",
    }
)
SERVER_MADE = re.compile(r"[0-9a-f]{32}")  # a request id the server made (uuid4 hex)
FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,  # examples run against a server started for this test only
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# --- what a request should give ------------------------------------------------------------------


def expected_segments(request: dict[str, Any]) -> list[str]:
    """What the engine is asked to voice for an accepted request (the fake G2P is the identity)."""
    text: str = request["text"]
    return split_phonemes(
        text.strip(), FakeEngine.max_phonemes, pack=request.get("deadline_ms") is not None
    )


def expected_audio_bytes(request: dict[str, Any]) -> int:
    speed = request.get("speed")
    speed = 1.0 if speed is None else float(speed)
    return sum(expected_pcm_bytes(s, speed) for s in expected_segments(request))


def assert_clean_error(code: object, message: object) -> None:
    assert code in ERROR_CODES, code
    assert isinstance(message, str)
    assert message
    assert "Traceback" not in message


def engine_calls_since(engine: FakeEngine, before: int) -> list[str]:
    return engine.calls[before:]


def assert_nothing_left(server: RunningServer) -> None:
    """Nothing in flight (the drain hook's view), no engine work running or queued."""
    assert wait_drained(server.http_url, 10, 0.01) == 0
    load = httpx.get(server.http_url + "/load").json()
    assert (load["inflight"], load["busy"], load["waiting"]) == (0, 0, 0)
    metrics = httpx.get(server.http_url + "/metrics").text
    assert "model_server_busy_workers 0.0" in metrics
    assert "model_server_waiting_segments 0.0" in metrics


# --- JSON of every shape -------------------------------------------------------------------------

SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
# JSON that parses (no NaN, no integer beyond a double): a wrong type, not invalid_json
FINITE_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=5,
)
NOT_STRINGS = FINITE_VALUES.filter(lambda v: v is not None and not isinstance(v, str))
SPEAKABLE = st.text(min_size=1, max_size=80).filter(str.strip)
HUGE_TEXT = st.integers(MAX_TEXT_CHARS + 1, 1_000_000).map(lambda n: "a" * n)
# spaces at either end are refused: X-Request-Id would echo them trimmed (HTTP trims headers)
REQUEST_IDS = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=40
).filter(lambda rid: rid == rid.strip())
BAD_REQUEST_IDS = (
    st.just("")
    | st.text(min_size=129, max_size=200)
    | st.text(min_size=1).filter(lambda s: not (s.isascii() and s.isprintable()))
    | st.sampled_from([" a", "a ", "  "])
    | FINITE_VALUES.filter(lambda v: v is not None and not isinstance(v, str))
)


def _is_speed(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and 0.5 <= v <= 2.0


def _dumps(obj: object) -> bytes:
    """Any JSON, as Python writes it (NaN and Infinity included: not JSON, so invalid_json)."""
    return json.dumps(obj).encode()


# --- cases: a message, and what must come back -------------------------------------------------

AUDIO = "audio"  # a synthesis: audio, and on the WebSocket its start and complete events
SILENT = "silent"  # no answer at all (a WebSocket cancel of nothing)
ANY = "any"  # junk: an error with a documented code, a whole synthesis, or (WebSocket) nothing


@dataclass(frozen=True)
class Step:
    """One client message, how it travels, and what must come back: AUDIO, SILENT, ANY or an
    error code, carrying `request_id`; without one, an id the server made (`made_id`: a
    synthesis request, even a refused one) or none."""

    message: bytes
    outcome: str
    request_id: str | None = None
    made_id: bool = False
    encoding: str = "text"  # a "text" or "binary" frame, or a message in three "fragments"

    def frame(self) -> str | bytes | list[str] | list[bytes]:
        if self.encoding == "text":
            return self.message.decode()
        if self.encoding == "text fragments":
            return _thirds(self.message.decode())
        if self.encoding == "binary fragments":
            return _thirds(self.message)
        return self.message

    def sent_as(self, encoding: str) -> Step:
        return dataclasses.replace(self, encoding=encoding)


def _thirds[T: (str, bytes)](data: T) -> list[T]:
    """A message cut in up to three fragments (one, when it is empty)."""
    size = max(1, len(data) // 3)
    return [data[i : i + size] for i in range(0, len(data), size)] or [data]


def _step(obj: object, outcome: str, request_id: str | None = None, made_id: bool = False) -> Step:
    return Step(_dumps(obj), outcome, request_id, made_id)


def _with_id(obj: dict[str, Any], request_id: str | None) -> dict[str, Any]:
    return obj if request_id is None else {**obj, "request_id": request_id}


VALID_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "voice": st.sampled_from((*VOICES, "")),
    "speed": st.floats(0.5, 2.0),
    "deadline_ms": st.floats(0, 600_000),
    "timestamps": st.booleans(),
}
OPTIONAL_ID = st.none() | REQUEST_IDS
SYNTHESES = st.builds(
    lambda body, rid: _step(_with_id(body, rid), AUDIO, rid, made_id=True),
    st.fixed_dictionaries(
        {"text": SPEAKABLE}, optional={"type": st.just("synthesize"), **VALID_FIELDS}
    ),
    OPTIONAL_ID,
)


def _refused(name: str, values: st.SearchStrategy[Any], code: str) -> st.SearchStrategy[Step]:
    """A synthesis with one bad field, answered with `code` and the request's id."""
    return st.builds(
        lambda value, rid: _step(
            _with_id({"text": "Hi.", name: value}, rid), code, rid, made_id=True
        ),
        values,
        OPTIONAL_ID,
    )


# requests that fail one check, answered alike on the WebSocket and by POST
BAD_REQUESTS = st.one_of(
    _refused("text", st.none(), "missing_text"),
    _refused("text", st.text(alphabet=" \t\n\r\u2028", max_size=5), "empty_text"),
    _refused("text", HUGE_TEXT, "text_too_long"),
    _refused("text", NOT_STRINGS, "invalid_field"),
    _refused(
        "voice",
        st.text(min_size=1).filter(lambda v: v not in VOICES and not blends.is_blend(v)),
        "unknown_voice",
    ),
    # a blend of a voice not loaded, as a string or a list
    _refused("voice", st.sampled_from(["nobody(2)+jf_alpha", ["af_test", "x"]]), "unknown_voice"),
    _refused("voice", st.sampled_from(["jf_alpha(0)+af_test", "a++b"]), "invalid_voice"),
    _refused(
        "voice",
        NOT_STRINGS.filter(
            lambda v: not (isinstance(v, list) and v and all(isinstance(p, str) for p in v))
        ),
        "invalid_field",
    ),
    _refused(
        "speed", FINITE_VALUES.filter(lambda v: v is not None and not _is_speed(v)), "invalid_speed"
    ),
    _refused(
        "deadline_ms",
        st.floats(max_value=-0.001, allow_infinity=False)
        | st.floats(min_value=600_000.001, allow_infinity=False)
        | st.text()
        | st.booleans(),
        "invalid_field",
    ),
    _refused(
        "timestamps",
        FINITE_VALUES.filter(lambda v: not isinstance(v, bool | None)),
        "invalid_field",
    ),
    # a bad id cannot be echoed: the error has none
    BAD_REQUEST_IDS.map(lambda rid: _step({"text": "Hi.", "request_id": rid}, "invalid_field")),
    FINITE_VALUES.filter(lambda v: not isinstance(v, dict)).map(
        lambda v: _step(v, "not_an_object")
    ),
    st.text(max_size=40).map(lambda s: Step(b"not json " + s.encode(), "invalid_json")),
)
# what only the WebSocket reads: the message types
BAD_MESSAGES = st.one_of(
    st.builds(
        lambda kind, rid: _step(_with_id({"type": kind}, rid), "unknown_type", rid),
        FINITE_VALUES.filter(lambda v: v not in ("synthesize", "cancel", "close")),
        OPTIONAL_ID,
    ),
    st.text(min_size=1, max_size=40).map(
        lambda rid: _step({"type": "cancel", "request_id": rid}, "unknown_request_id", rid)
    ),
    FINITE_VALUES.filter(lambda v: v is not None and not (isinstance(v, str) and v)).map(
        lambda rid: _step({"type": "cancel", "request_id": rid}, "invalid_field")
    ),
    st.just(_step({"type": "cancel"}, SILENT)),
)
JUNK = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "text": SPEAKABLE | HUGE_TEXT | JSON_VALUES,
            **{name: values | JSON_VALUES for name, values in VALID_FIELDS.items()},
            "request_id": REQUEST_IDS | JSON_VALUES,
            "type": st.sampled_from(("synthesize", "cancel")) | JSON_VALUES,
        },
    )
    .filter(lambda obj: obj.get("type") != "close")  # a close ends the session: not junk
    .map(lambda obj: _step(obj, ANY)),
    JSON_VALUES.map(lambda v: _step(v, ANY)),
)
BINARY = st.one_of(
    st.binary(max_size=60).map(lambda b: Step(b"\xff" + b, "invalid_utf8")),
    st.binary(max_size=200).map(lambda b: Step(b, ANY)),
    st.tuples(SYNTHESES, st.binary(min_size=1, max_size=8)).map(
        lambda t: Step(t[0].message + t[1], ANY)
    ),
)


def _sent(steps: st.SearchStrategy[Step], *encodings: str) -> st.SearchStrategy[Step]:
    return st.builds(Step.sent_as, steps, st.sampled_from(encodings))


# --- (a) POST /invocations -----------------------------------------------------------------------

POST_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    **VALID_FIELDS,
    "format": st.sampled_from(formats.MODEL_SERVER_FORMATS),
    "stream": st.booleans(),
    "request_id": REQUEST_IDS,
}
POST_BAD_FIELDS = st.one_of(
    _refused("format", FINITE_VALUES | st.sampled_from(("mp3", "PCM", "")), "unsupported_format"),
    _refused(
        "stream", FINITE_VALUES.filter(lambda v: not isinstance(v, bool | None)), "invalid_field"
    ),
)
POST_CASES = st.one_of(
    st.fixed_dictionaries({"text": SPEAKABLE}, optional=POST_FIELDS).map(
        lambda body: _step(body, AUDIO)
    ),
    BAD_REQUESTS,
    POST_BAD_FIELDS,
    JUNK,
    BINARY,
)
CONTENT_TYPES = st.sampled_from(
    (
        None,
        "application/json",
        "application/json; charset=latin-1",
        "text/plain",
        "application/octet-stream",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    )
)


def _timestamps_streamed(case: Step) -> bool:
    try:
        request = orjson.loads(case.message)
    except orjson.JSONDecodeError:
        return False
    if not isinstance(request, dict):
        return False
    return request.get("timestamps") is True and request.get("stream") is True


def check_post_answer(case: Step, response: httpx.Response) -> list[str]:
    """Audio of exactly the right length, or a clean 400 with the case's code; returns the
    engine calls it should have made."""
    if response.status_code != 200:
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert_clean_error(error["code"], error["message"])
        assert error["retryable"] is False
        refused = case.outcome == AUDIO and _timestamps_streamed(case)  # need stream false
        assert case.outcome in (ANY, error["code"]) or (
            refused and error["code"] == "invalid_field"
        )
        return []
    assert case.outcome in (AUDIO, ANY)
    assert not _timestamps_streamed(case)
    request = orjson.loads(case.message)
    fmt = formats.lookup(request.get("format", "pcm"))
    if "request_id" in request:
        assert response.headers["x-request-id"] == request["request_id"]
    pcm = response.content
    if request.get("timestamps") is True:  # one JSON answer: the audio as base64, beside its words
        assert response.headers["content-type"] == "application/json"
        answer = response.json()
        assert (answer["format"], answer["sample_rate"]) == (fmt.name, 24_000)
        pcm = base64.b64decode(answer["audio"])
        check_words(
            request["text"], answer["words"], (len(pcm) - 44 * (fmt.name == "wav")) / 48_000
        )
    else:
        assert response.headers["content-type"] == fmt.mime
    if fmt.name == "wav":
        assert pcm[:4] == b"RIFF"
        pcm = pcm[44:]
    assert len(pcm) == expected_audio_bytes(request)
    return expected_segments(request)


def check_words(text: str, words: object, duration_s: float) -> None:
    """Word timings: the text's own words, in its order, in time order inside the audio."""
    assert isinstance(words, list)
    timings = parse_words(words)
    assert len(timings) == len(words)  # every entry well formed
    position, previous_end = 0, 0.0
    for w in timings:
        found = text.find(w.word, position)
        assert w.word.strip() == w.word != ""
        assert found >= 0, (w.word, text)
        position = found + len(w.word)
        assert previous_end <= w.start <= w.end <= duration_s + 5e-4, (w, previous_end)
        previous_end = w.end


def test_post_answers_audio_or_a_clean_error(
    own_fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    with httpx.Client(base_url=own_fake_server.http_url, timeout=30) as http:

        @FUZZ
        @given(case=POST_CASES, content_type=CONTENT_TYPES)
        def post(case: Step, content_type: str | None) -> None:
            before = len(fake_engine.calls)
            headers = {"content-type": content_type} if content_type else {}
            response = http.post("/invocations", content=case.message, headers=headers)
            assert engine_calls_since(fake_engine, before) == check_post_answer(case, response)

        post()
    assert_nothing_left(own_fake_server)


def test_the_post_oracle_tells_right_from_wrong(own_fake_server: RunningServer) -> None:
    case = Step(b'{"text": "Hi there. You.", "speed": 2, "format": "wav"}', AUDIO)
    with httpx.Client(base_url=own_fake_server.http_url) as http:
        good = http.post("/invocations", content=case.message)
    assert check_post_answer(case, good) == ["Hi there.", "You."]
    short = httpx.Response(200, headers=good.headers, content=good.content[:-2])
    with pytest.raises(AssertionError):
        check_post_answer(case, short)
    crashed = httpx.Response(500, json={"error": {"code": "internal_error", "message": "x"}})
    with pytest.raises(AssertionError):
        check_post_answer(case, crashed)
    error = {"code": "invalid_json", "message": "not JSON", "retryable": False}
    wrong_code = httpx.Response(400, json={"error": error})
    with pytest.raises(AssertionError):
        check_post_answer(dataclasses.replace(case, outcome="missing_text"), wrong_code)


# --- (b) WS /invocations-bidirectional-stream ----------------------------------------------------

ENCODINGS = ("text", "text fragments", "binary", "binary fragments")
STEPS = st.one_of(
    _sent(SYNTHESES, *ENCODINGS),
    _sent(BAD_REQUESTS | BAD_MESSAGES, *ENCODINGS),
    _sent(JUNK, *ENCODINGS),
    _sent(BINARY, "binary", "binary fragments"),  # not UTF-8: no text frame can carry it
)


@dataclass
class Answer:
    """What came back for one step: control events in order, and the audio."""

    events: list[dict[str, Any]] = field(default_factory=list)
    pcm: bytearray = field(default_factory=bytearray)
    kinds: list[str] = field(default_factory=list)  # every frame of the step: type or "audio"


def exchange(ws: ClientConnection, step: Step, probe_id: str) -> Answer:
    """Send a step, then a probe whose answer is known (an unknown type): everything the step
    caused comes back before the probe's error or, for a synthesis, before its terminal event."""
    ws.send(step.frame())
    ws.send(orjson.dumps({"type": "probe", "request_id": probe_id}).decode())
    answer, running, probed = Answer(), set[str](), False
    while not probed or running:
        frame = ws.recv(timeout=30)
        if isinstance(frame, bytes):
            answer.pcm += frame
            answer.kinds.append("audio")
            continue
        event = orjson.loads(frame)
        if event.get("request_id") != probe_id:
            answer.kinds.append(event["type"])
        if event.get("request_id") == probe_id:
            assert (event["type"], event["code"]) == ("error", "unknown_type")
            probed = True
        elif event["type"] == "synthesis_start":
            answer.events.append(event)
            running.add(event["request_id"])
        else:
            answer.events.append(event)
            if event["type"] != "word_timings":  # every other event ends its request
                running.discard(event.get("request_id", ""))
    return answer


def check_id(event: dict[str, Any], step: Step) -> None:
    if step.request_id is not None:
        assert event["request_id"] == step.request_id
    elif step.made_id:
        assert SERVER_MADE.fullmatch(event["request_id"])
    else:
        assert "request_id" not in event


def check_synthesis(step: Step, answer: Answer) -> list[str]:
    request = orjson.loads(step.message)
    if request.get("timestamps") is True:  # each segment's words, then its audio
        middle = answer.kinds[1:-1]
        assert middle == ["word_timings", "audio"] * (len(middle) // 2), answer.kinds
        timings = [e for e in answer.events if e["type"] == "word_timings"]
        words = [w for e in timings for w in e["words"]]
        check_words(request["text"], words, len(answer.pcm) / 48_000)
        answer = dataclasses.replace(
            answer, events=[e for e in answer.events if e["type"] != "word_timings"]
        )
    else:
        assert "word_timings" not in answer.kinds
    assert [e["type"] for e in answer.events] == ["synthesis_start", "synthesis_complete"]
    start, complete = answer.events
    if "request_id" in request:
        assert start["request_id"] == request["request_id"]
    else:
        assert SERVER_MADE.fullmatch(start["request_id"])
    assert complete["request_id"] == start["request_id"]
    assert len(answer.pcm) == complete["audio_bytes"] == expected_audio_bytes(request)
    return expected_segments(request)


def check_error(step: Step, answer: Answer) -> None:
    assert [e["type"] for e in answer.events] == ["error"]
    error = answer.events[0]
    assert_clean_error(error["code"], error["message"])
    assert answer.pcm == b""
    if step.outcome != ANY:
        assert error["code"] == step.outcome
        check_id(error, step)


def check_answer(step: Step, answer: Answer) -> list[str]:
    """Asserts the answer fits the step; returns the engine calls it should have made."""
    types = [e["type"] for e in answer.events]
    if step.outcome == AUDIO or (step.outcome == ANY and "synthesis_start" in types):
        return check_synthesis(step, answer)
    if step.outcome == SILENT or (step.outcome == ANY and not types):
        assert answer == Answer()
        return []
    check_error(step, answer)
    return []


def run_session(server: RunningServer, engine: FakeEngine, steps: Sequence[Step]) -> None:
    with connect(server.ws_url + BIDI, max_size=None) as ws:
        for i, step in enumerate(steps):
            before = len(engine.calls)
            answer = exchange(ws, step, f"probe-{i}")
            assert engine_calls_since(engine, before) == check_answer(step, answer)
        # still usable: a plain synthesis, then a clean close
        final = _step({"text": "Still works.", "request_id": "final"}, AUDIO, "final", True)
        assert check_answer(final, exchange(ws, final, "probe-final")) == ["Still works."]
        ws.send(orjson.dumps({"type": "close"}).decode())
        with pytest.raises(ConnectionClosedOK) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1000


def test_websocket_sessions_survive_any_frames(
    own_fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    @FUZZ
    @given(st.lists(STEPS, min_size=1, max_size=8))
    def session(steps: list[Step]) -> None:
        run_session(own_fake_server, fake_engine, steps)

    session()
    assert_nothing_left(own_fake_server)


def test_the_session_oracle_rejects_wrong_answers() -> None:
    step = _step({"text": "Hi.", "request_id": "r"}, AUDIO, "r", made_id=True)
    start = {"type": "synthesis_start", "request_id": "r"}
    n = expected_pcm_bytes("Hi.")
    complete = {"type": "synthesis_complete", "request_id": "r", "audio_bytes": n}
    assert check_answer(step, Answer([start, complete], bytearray(n))) == ["Hi."]
    with pytest.raises(AssertionError):  # audio short of what the engine made
        check_answer(step, Answer([start, {**complete, "audio_bytes": n - 2}], bytearray(n - 2)))
    refused = _step({"type": "sing"}, "unknown_type")
    with pytest.raises(AssertionError):  # an undocumented code
        check_answer(refused, Answer([{"type": "error", "code": "oops", "message": "x"}]))
    error = {"type": "error", "code": "invalid_json", "message": "x"}
    with pytest.raises(AssertionError):  # junk answered twice
        check_answer(_step([], ANY), Answer([error, error]))


# --- schemathesis against the published OpenAPI schema ------------------------------------------

OPENAPI = create_app(Settings(warmup=False)).openapi()
schema = schemathesis.openapi.from_dict(OPENAPI)


def test_the_schema_tested_is_the_one_served(fake_server: RunningServer) -> None:
    assert httpx.get(fake_server.http_url + "/openapi.json").json() == OPENAPI


@schema.parametrize()
@settings(max_examples=20, deadline=None, database=None)
def test_routes_keep_their_openapi_contract(case: Case[Any], fake_server: RunningServer) -> None:
    case.call_and_validate(
        base_url=fake_server.http_url,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
