"""First audio and word timestamps, and barge-ins, through the voice-agent frameworks' plugins
(make bench-frameworks).

Each client module here drives one client against a running gateway and returns a
`FrameworkRun`; `bench.bench_frameworks` runs them side by side with the gateway's own
WebSocket. `barge_in_runner` times barge-ins through one version of the plugins in a process of
its own (`BargeIn`), so the plugins as they were before protocol 2 run beside today's.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FrameworkRun:
    """One utterance through one client, timed from the moment its text is handed over."""

    client: str
    first_audio_s: float
    """From the text handed to the client to its first audio."""
    first_word_s: float | None
    """From the text handed over to its first word timestamp (None: the client gives none)."""
    audio_s: float
    """Seconds of audio received, from the byte count (24 kHz, 16-bit mono)."""
    words: tuple[str, ...]
    """The words that came with timestamps, in order."""


@dataclass(frozen=True)
class BargeIn:
    """One barge-in through one plugin."""

    plugin: str
    barge_in_s: float
    """From the interruption to the next turn's first audio out of the plugin."""
    first_audio_s: float
    """The interrupted turn's first audio, from its text handed over (for the record)."""
    leftover_frames: int
    """The interrupted turn's audio frames the plugin handed on after the interruption (pipecat:
    after the `InterruptionFrame` came through the pipeline, what a transport would play)."""
    leftover_s: float
    """Their seconds of audio."""
    overtaken_frames: int
    """pipecat: the interrupted turn's audio frames that came out of the pipeline after the
    interruption was queued but before the `InterruptionFrame` came through (a transport drops
    them as it arrives); LiveKit: 0."""
    overtaken_s: float
    """Their seconds of audio."""
    next_audio_s: float
    """The next turn's audio, all of it (a check that it was spoken whole)."""
    next_first_frame_s: float | None
    """The audio in the next turn's first frame as the gateway sent it: how much the model
    server decoded before sending its first audio (a short first window, or a larger one).
    None: LiveKit's, which its audio emitter hands on in frames of its own size."""
    error: str | None = None
