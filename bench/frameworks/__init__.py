"""First audio and word timestamps through the voice-agent frameworks' plugins
(make bench-frameworks).

Each module here drives one client against a running gateway and returns a `FrameworkRun`;
`bench.bench_frameworks` runs them side by side with the gateway's own WebSocket.
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
