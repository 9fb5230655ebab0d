"""What a chunk plan learns from the model server's reports, shared by every reply (the reply
factory owns them): seconds of synthesis per chunk (`chunk_speed`), characters spoken per second
(`SpeechRate`), how much audio a first frame holds (`EarlyAudio`); and `Rates`, a frozen reading
of them at one moment, which is what a plan's timeline is computed from."""

from __future__ import annotations

from dataclasses import dataclass

from kokoro_contract.speed import PRIOR_SECONDS_PER_CALL, PRIOR_SECONDS_PER_CHARACTER, SpeedModel

# the audio of a progressive model server's first window of a reply, trimmed, until a first
# chunk shows it: the least it was measured to be, so a plan counts on no more audio than a first
# window gives (docs/measured.md, "2026-12-01 (night)" and "2026-12-03 (evening)")
FIRST_WINDOW_AUDIO_S = 0.55


def chunk_speed() -> SpeedModel:
    """Seconds of synthesis per chunk against its characters, queueing included, as a plan
    learns it from the model server's reports (prior: `kokoro_contract.speed`'s, per call and
    per character)."""
    return SpeedModel(PRIOR_SECONDS_PER_CALL, PRIOR_SECONDS_PER_CHARACTER)


@dataclass
class SpeechRate:
    """Characters spoken per second at speed 1, learned from the audio each chunk gave."""

    chars_per_s: float = 18.0  # Kokoro at speed 1 (docs/measured.md, "Conversations at once")
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


@dataclass(frozen=True)
class Rates:
    """The learned rates as a plan reads them at one moment (`of`): equal readings give equal
    estimates, so a timeline computed from one holds until the rates move (another reply's
    report moves them too: they are shared)."""

    synth: tuple[float, float]  # seconds of synthesis per chunk and per character
    # seconds to a chunk's first audio, per chunk and per character; None: the whole synthesis
    # (the model server has not shown that it speaks progressively)
    first: tuple[float, float] | None
    spoken_per_s: float  # characters spoken per second, at the reply's speed
    early_s: float | None  # audio in a first frame (None: all of a chunk's, at once)

    @classmethod
    def of(
        cls,
        speed: SpeedModel,
        speech: SpeechRate,
        speed_factor: float,
        first_speed: SpeedModel | None = None,
        early: EarlyAudio | None = None,
    ) -> Rates:
        """The rates a plan reads now: `first_speed` only once `early` shows the model server
        speaks progressively (its first audio hardly grows with the chunk: the prior's shape)."""
        progressive = first_speed is not None and early is not None and early.seconds is not None
        return cls(
            speed.line,
            first_speed.line if progressive and first_speed is not None else None,
            speech.chars_per_s * speed_factor,
            None if early is None else early.seconds,
        )

    def synth_s(self, chars: int) -> float:
        """Seconds of synthesis for a chunk of `chars` (`SpeedModel.estimate`)."""
        a, b = self.synth
        return a + b * chars

    def first_s(self, chars: int) -> float:
        """Seconds from a chunk's synthesis start to its first audio: at most the whole."""
        whole = self.synth_s(chars)
        if self.first is None:
            return whole
        a, b = self.first
        return min(whole, a + b * chars)

    def audio_s(self, chars: int) -> float:
        """How long a chunk of `chars` plays."""
        return chars / self.spoken_per_s

    def early(self, audio_s: float) -> float:
        """How much of a chunk of `audio_s` comes with its first audio (`EarlyAudio.of`)."""
        return audio_s if self.early_s is None else min(audio_s, self.early_s)
