"""`kokoro_contract.load`: the `/load` answer's JSON, its keys and their order, read back
field for field, and a body that says no load refused with one error naming what is wrong."""

from __future__ import annotations

import dataclasses
import json

import pytest

from kokoro_contract.load import LoadReport, MalformedLoadReport

# every field away from its default, so a field dropped on either way shows
EVERY_FIELD = LoadReport(
    workers=4,
    busy=3,
    waiting=2,
    backlog_s=0.912,
    min_slack_s=-0.25,
    seconds_per_call=0.0412,
    seconds_per_phoneme=0.00037,
    realtime_streams=61.5,
    shared_seconds_per_call=0.046,
    shared_seconds_per_phoneme=0.000426,
    first_window_s=0.031,
    deadline_misses=7,
    scheduling="fair",
    batch_curve={"1": 0.0061, "2": 0.0042},
    inflight=5,
)
MINIMAL = {
    "workers": 2,
    "busy": 1,
    "waiting": 0,
    "backlog_s": 1.5,
    "min_slack_s": None,
    "seconds_per_call": 0.1,
    "seconds_per_phoneme": 0.02,
}


def test_a_report_reads_back_as_it_was_said() -> None:
    assert LoadReport.decode(EVERY_FIELD.encode()) == EVERY_FIELD
    assert LoadReport.decode(EVERY_FIELD.encode().decode()) == EVERY_FIELD  # text, too


def test_the_answer_keeps_its_keys_and_their_order() -> None:
    """The wire a gateway of any version reads: these names, in this order, as compact JSON
    (what the route answered with FastAPI's JSONResponse before, byte for byte)."""
    body = EVERY_FIELD.encode()
    assert list(json.loads(body)) == [
        "workers",
        "busy",
        "waiting",
        "backlog_s",
        "min_slack_s",
        "seconds_per_call",
        "seconds_per_phoneme",
        "realtime_streams",
        "shared_seconds_per_call",
        "shared_seconds_per_phoneme",
        "first_window_s",
        "deadline_misses",
        "scheduling",
        "batch_curve",
        "inflight",
    ]
    said = dataclasses.asdict(EVERY_FIELD)
    assert body == json.dumps(said, separators=(",", ":"), ensure_ascii=False).encode()


def test_an_older_servers_answer_reads_with_the_defaults() -> None:
    report = LoadReport.decode(json.dumps(MINIMAL))
    assert report == LoadReport(2, 1, 0, 1.5, None, 0.1, 0.02)
    assert (report.realtime_streams, report.shared_seconds_per_call) == (1e9, None)
    assert (report.first_window_s, report.deadline_misses, report.inflight) == (None, 0, 0)
    assert report.batch_curve is None


def test_keys_it_does_not_know_are_left_out() -> None:
    report = LoadReport.decode(json.dumps(MINIMAL | {"queue_depth": 3, "engine": "onnx"}))
    assert report == LoadReport.decode(json.dumps(MINIMAL))


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"<html>502 Bad Gateway</html>", "the /load answer is not JSON"),
        (b"", "the /load answer is not JSON"),
        (b"[1, 2]", "the /load answer must be a JSON object, got list"),
        (b'"busy"', "the /load answer must be a JSON object, got str"),
        (json.dumps(MINIMAL | {"busy": "many"}), "the /load answer's busy is not a number: 'many'"),
        (json.dumps(MINIMAL | {"backlog_s": [1]}), "the /load answer's backlog_s is not a number"),
        (json.dumps(MINIMAL | {"seconds_per_call": None}), "seconds_per_call is not a number"),
        (json.dumps(MINIMAL | {"realtime_streams": None}), "realtime_streams is not a number"),
        (json.dumps(MINIMAL | {"first_window_s": "soon"}), "first_window_s is not a number"),
        (json.dumps(MINIMAL | {"scheduling": 1}), "the /load answer's scheduling is not a string"),
        (json.dumps(MINIMAL | {"batch_curve": [0.1]}), "batch_curve is not a curve: [0.1]"),
        (json.dumps(MINIMAL | {"batch_curve": {"two": 0.1}}), "batch_curve is not a curve"),
        (json.dumps(MINIMAL | {"batch_curve": {"2": -1}}), "batch_curve is not a curve"),
        (json.dumps(MINIMAL | {"batch_curve": {"2": True}}), "batch_curve is not a curve"),
        (json.dumps(MINIMAL | {"batch_curve": {"0": 0.1}}), "batch_curve is not a curve"),
        (json.dumps({k: v for k, v in MINIMAL.items() if k != "workers"}), "has no workers"),
    ],
)
def test_an_answer_that_says_no_load_is_refused(body: bytes | str, said: str) -> None:
    """One error, a ValueError (what a gateway's pool takes for a server down), that says
    what is wrong; never a KeyError or an AttributeError from deep in the parse."""
    with pytest.raises(MalformedLoadReport) as caught:
        LoadReport.decode(body)
    assert isinstance(caught.value, ValueError)
    assert said in str(caught.value)


def test_a_long_wrong_value_is_cut_short_in_the_error() -> None:
    with pytest.raises(MalformedLoadReport) as caught:
        LoadReport.decode(json.dumps(MINIMAL | {"busy": "x" * 1000}))
    assert len(str(caught.value)) < 100
