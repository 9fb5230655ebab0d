"""The model server's `GET /load` answer: what it says of its engine's speed and backlog, and
what a gateway's admission reads of it. One dataclass for both sides (the server fills every
field; a gateway reading an older server gets the defaults), the typical sizes in phonemes
both sides count a reply's chunks by, and the progressive server's window sizes the gateway's
chunk plan expects."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

# a new reply's first chunk as admission counts it, and the size a progressive server publishes
# its first-window time for: a typical five-word first chunk is 20-28 phonemes; counting it as
# 45 is the margin that kept admitted replies free of gaps on 2 cores (with 25, 2 of 5 served
# replies had gaps at 3 conversations: docs/measured.md)
FIRST_CHUNK_PHONEMES = 45
SEGMENT_PHONEMES = 60  # a typical later chunk, for comparing speeds alone and side by side
# a progressive server's decoder windows, which a gateway's chunk plan expects: Kokoro's frame
# (600 samples at 24 kHz), and the largest window (`model_server.windows.Schedule.largest`)
FRAME_S = 0.025
LARGEST_WINDOW_FRAMES = 192


@dataclass(frozen=True)
class LoadReport:
    """How far behind the engine is, in seconds, and how fast it has been."""

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

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Self:
        slack = body.get("min_slack_s")
        return cls(
            workers=int(body["workers"]),
            busy=int(body["busy"]),
            waiting=int(body["waiting"]),
            backlog_s=float(body["backlog_s"]),
            min_slack_s=None if slack is None else float(slack),
            seconds_per_call=float(body["seconds_per_call"]),
            seconds_per_phoneme=float(body["seconds_per_phoneme"]),
            realtime_streams=float(body.get("realtime_streams", 1e9)),
            shared_seconds_per_call=_optional(body.get("shared_seconds_per_call")),
            shared_seconds_per_phoneme=_optional(body.get("shared_seconds_per_phoneme")),
            first_window_s=_optional(body.get("first_window_s")),
            deadline_misses=int(body.get("deadline_misses", 0)),
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _optional(value: Any) -> float | None:
    return None if value is None else float(value)
