"""The model server's `GET /load` answer: what it says of its engine's speed and backlog, and
what a gateway's admission reads of it. One dataclass for both sides, with its JSON (the
server fills every field; a gateway reading an older server gets the defaults), the typical
sizes in phonemes both sides count a reply's chunks by, and the progressive server's window
sizes the gateway's chunk plan expects."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

import orjson

# a new reply's first chunk as admission counts it, and the size a progressive server publishes
# its first-window time for: well above a typical five-word first chunk, a margin that kept
# admitted replies free of gaps on 2 cores, where counting a first chunk at its typical size
# let gapped replies in at 3 conversations
# (docs/measured.md, "Conversations at once (`make bench-load`)")
FIRST_CHUNK_PHONEMES = 45
# a typical later chunk: the server's real-time capacity and admission's slowdown of a reply
# beside another are both reckoned on a segment this long
SEGMENT_PHONEMES = 60
# seconds of speech per phoneme token, typically (a server learns its own from what it voices)
SPEECH_S_PER_PHONEME = 0.065
# a progressive server's decoder windows: Kokoro's frame (600 samples at 24 kHz), and the
# largest window, which the server's window ladder stops at and a gateway's chunk plan expects
FRAME_S = 0.025
LARGEST_WINDOW_FRAMES = 192


class MalformedLoadReport(ValueError):
    """A `/load` answer that says no load: not JSON, not an object, or a field missing or not
    a number. A gateway takes its server for down, as one that cannot be reached."""


@dataclass(frozen=True)
class LoadReport:
    """How far behind the engine is, in seconds, and how fast it has been. The fields, in
    order, are the answer's JSON keys."""

    workers: int
    busy: int
    waiting: int
    backlog_s: float  # compute queued or still running, per worker: the wait a new segment sees
    min_slack_s: float | None  # tightest waiting deadline minus its projected finish (EDF order)
    seconds_per_call: float  # the learned speed: a + b x phonemes
    seconds_per_phoneme: float
    realtime_streams: float = 1e9  # replies it can voice at once (older servers: unbounded)
    # the speed of calls that ran beside another (learned; older servers: None)
    shared_seconds_per_call: float | None = None
    shared_seconds_per_phoneme: float | None = None
    # progressive: a typical first chunk's (`FIRST_CHUNK_PHONEMES`) front pass and first window,
    # the compute before a new reply's first audio and what its start takes from the others
    # (learned; None: not progressive, or an older server)
    first_window_s: float | None = None
    deadline_misses: int = 0  # explicit deadlines missed since the server started
    scheduling: str = "edf"  # the server's --scheduling
    # with --batch on: seconds per frame of a batched decoder step (each row a block of that
    # many frames) by the batch sizes seen, learned (None: not batched, or an older server)
    batch_curve: dict[str, float] | None = None
    # requests and sessions the server runs now, as `/ping` counts them: its route fills this
    # in, the scheduler does not know it
    inflight: int = 0

    @classmethod
    def decode(cls, data: bytes | str) -> Self:
        """The report a `/load` body says; `MalformedLoadReport` when it says none."""
        try:
            body = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise MalformedLoadReport(f"the /load answer is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise MalformedLoadReport(
                f"the /load answer must be a JSON object, got {type(body).__name__}"
            )
        return cls.from_json(body)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Self:
        """The report a parsed `/load` body says (keys it does not know are left out);
        `MalformedLoadReport` when a field is missing or not a number."""
        scheduling = body.get("scheduling", "edf")
        if not isinstance(scheduling, str):
            raise MalformedLoadReport(
                f"the /load answer's scheduling is not a string: {scheduling!r:.40}"
            )
        return cls(
            workers=_number(body, "workers", int),
            busy=_number(body, "busy", int),
            waiting=_number(body, "waiting", int),
            backlog_s=_number(body, "backlog_s", float),
            min_slack_s=_optional(body, "min_slack_s"),
            seconds_per_call=_number(body, "seconds_per_call", float),
            seconds_per_phoneme=_number(body, "seconds_per_phoneme", float),
            realtime_streams=_number(body, "realtime_streams", float, 1e9),
            shared_seconds_per_call=_optional(body, "shared_seconds_per_call"),
            shared_seconds_per_phoneme=_optional(body, "shared_seconds_per_phoneme"),
            first_window_s=_optional(body, "first_window_s"),
            deadline_misses=_number(body, "deadline_misses", int, 0),
            scheduling=scheduling,
            batch_curve=batch_curve_from_json(body.get("batch_curve")),
            inflight=_number(body, "inflight", int, 0),
        )

    def to_json(self) -> dict[str, Any]:
        """The `/load` body as a JSON object, its keys in the fields' order."""
        return dataclasses.asdict(self)

    def encode(self) -> bytes:
        """The `/load` body."""
        return orjson.dumps(self.to_json())


def batch_curve_from_json(value: Any) -> dict[str, float] | None:
    """A `batch_curve`: batch sizes (as strings, 1 or more) to seconds per frame, or None."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str)
        and k.isdigit()
        and int(k) >= 1
        and isinstance(v, int | float)
        and not isinstance(v, bool)
        and 0 <= v < math.inf
        for k, v in value.items()
    ):
        raise MalformedLoadReport(f"the /load answer's batch_curve is not a curve: {value!r:.60}")
    return {k: float(v) for k, v in value.items()}


def _number[N: (int, float)](
    body: Mapping[str, Any], name: str, kind: type[N], default: N | None = None
) -> N:
    """`body[name]` as a `kind`; `default` when it is absent (None: it may not be)."""
    if name not in body:
        if default is None:
            raise MalformedLoadReport(f"the /load answer has no {name}")
        return default
    return _convert(body[name], name, kind)


def _optional(body: Mapping[str, Any], name: str) -> float | None:
    """`body[name]` as a float, None when it is absent or null."""
    value = body.get(name)
    return None if value is None else _convert(value, name, float)


def _convert[N: (int, float)](value: Any, name: str, kind: type[N]) -> N:
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MalformedLoadReport(
            f"the /load answer's {name} is not a number: {value!r:.40}"
        ) from exc
