"""What a chunk plan learns from the model server's reports, shared by every reply (the reply
factory owns them): seconds of synthesis per chunk (`chunk_speed`), characters spoken per second
(`SpeechRate`), how much audio a first frame holds (`EarlyAudio`)."""

from __future__ import annotations

from dataclasses import dataclass

from kokoro_contract.speed import PRIOR_SECONDS_PER_CALL, PRIOR_SECONDS_PER_CHARACTER, SpeedModel

# the audio of a progressive model server's first window of a reply, trimmed: 0.55-0.63 s over
# the quality corpus (model_server/windows.py), 0.63 s through the stack here
FIRST_WINDOW_AUDIO_S = 0.55


def chunk_speed() -> SpeedModel:
    """Seconds of synthesis per chunk against its characters, queueing included, as a plan
    learns it from the model server's reports (prior: `kokoro_contract.speed`'s, per call and
    per character)."""
    return SpeedModel(PRIOR_SECONDS_PER_CALL, PRIOR_SECONDS_PER_CHARACTER)


@dataclass
class SpeechRate:
    """Characters spoken per second at speed 1, learned from the audio each chunk gave."""

    chars_per_s: float = 18.0  # Kokoro at speed 1, measured: 17-20
    weight: float = 0.2  # how far one chunk moves the estimate

    def observe(self, chars: int, audio_s: float, speed: float) -> None:
        if chars >= 10 and audio_s > 0:
            seen = chars / (audio_s * speed)
            self.chars_per_s += self.weight * (seen - self.chars_per_s)


@dataclass
class EarlyAudio:
    """Seconds of audio in a reply's first chunk's first frame, learned from the first chunks
    whose first frame held less than all of their audio; None until one did (then a chunk's
    audio comes all at once, with its first). Later chunks' first frames hold at least as much
    (the server sizes them by the lead they have)."""

    seconds: float | None = None
    weight: float = 0.3  # how far one chunk moves the estimate

    def observe(self, first_s: float, chunk_s: float) -> None:
        if 0.0 < first_s < chunk_s - 0.001:
            seen = self.seconds
            self.seconds = first_s if seen is None else seen + self.weight * (first_s - seen)

    def assume(self, seconds: float = FIRST_WINDOW_AUDIO_S) -> None:
        """A model server that says it speaks progressively: until a first chunk shows how
        much its first frame holds, take `seconds`."""
        if self.seconds is None:
            self.seconds = seconds

    def of(self, audio_s: float) -> float:
        """How much of a chunk of `audio_s` comes with its first audio."""
        return audio_s if self.seconds is None else min(audio_s, self.seconds)
