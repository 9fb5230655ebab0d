"""The playback plan's settings (`PlanConfig`), and the first chunk's slack under load, which
admission gives a reply still starting too (`FIRST_SLACK_S`)."""

from __future__ import annotations

from dataclasses import dataclass

from kokoro_contract.load import FRAME_S, LARGEST_WINDOW_FRAMES

# the first chunk is needed when it could be ready plus this: under load, a new reply's first
# chunk waits this long rather than make a reply in progress late (a reply whose server has
# nothing else to do has none: `ChunkPlan.alone`); admission gives a reply still starting as
# much spare time. The default of `--first-slack-s`
FIRST_SLACK_S = 1.0


@dataclass(frozen=True)
class PlanConfig:
    first_min_words: int = 4
    first_max_words: int = 5  # past this, the first chunk is cut only where a phrase begins...
    first_wait_words: int = 16  # ...or here at the latest
    first_wait_s: float = 0.6  # ...or this long after the first text, if the text is slow
    max_chars: int = 400  # one chunk: under Kokoro's 510 phonemes
    # sentences are grouped into a chunk only while its first audio (estimated) takes at most
    # this long: with an engine whose unit is the chunk, a long call holds a worker from a new
    # reply's first chunk, and its estimate errs the most; a progressive engine's first audio
    # hardly grows with the chunk, so its chunks grow to `max_chars`
    max_group_s: float = 2.5
    margin_s: float = 0.4  # a chunk should be ready this long before the listener needs it...
    margin_share: float = 0.25  # ...plus this share of its synthesis: estimates err by a share
    # the fixed part of that margin, `margin_s`, covers a chunk's start too (the engine's queue,
    # its front pass, the wire), and so the later windows of a chunk whose first audio may be
    # late by as much; once a first chunk's first audio is here, its later windows follow it
    # on an engine already at work, and only this much, plus the share, is kept for them
    ready_margin_s: float = 0.1
    lead_s: float = 0.15  # send the next chunk this long before the one before it is done
    first_slack_s: float = FIRST_SLACK_S  # a first chunk's slack under load (`FIRST_SLACK_S`)
    # the first audio is held, at most this long after it is ready, until the sentences
    # known so far can follow it without a gap; 0: played as soon as it is ready
    first_hold_s: float = 1.0
    # a progressive model server's windows, as the plan expects them (`window_spans`): the
    # first holds what a first chunk's first frame held (`EarlyAudio`), each after it twice
    # the one before, up to this much audio (`LARGEST_WINDOW_FRAMES` frames: 4.8 s)
    largest_window_s: float = round(LARGEST_WINDOW_FRAMES * FRAME_S, 6)
