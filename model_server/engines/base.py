"""The seam between routes and models: every engine turns phonemes into float audio."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from model_server.errors import SynthesisFailed
from model_server.windows import Window

FloatAudio = npt.NDArray[np.float32]
VoicePack = npt.NDArray[np.float32]  # (510, 1, 256): one style vector per phoneme count
Durations = npt.NDArray[np.int64]

# Kokoro's duration unit: one frame of the length regulator is 600 samples of 24 kHz audio
# (the decoder's 2x upsampling, the generator's 10 x 6, the iSTFT hop of 5), 25 ms.
SAMPLES_PER_FRAME = 600


@dataclass(frozen=True)
class Timed:
    """One segment's audio and how long each of its phonemes lasts in it.

    `durations` has one entry per character of the phoneme string the engine was given, with
    the model's two pads around them: `[start pad, *characters, end pad]`, in frames of
    `frame_samples` samples. A character the model's vocab lacks (dropped) has 0 frames. The
    frames add up to the audio's length: `durations.sum() * frame_samples == audio.size`."""

    audio: FloatAudio
    durations: Durations
    frame_samples: int


@dataclass(frozen=True)
class Front:
    """One segment's front pass (progressive synthesis): everything the decoder needs for any
    window of its `frames` (`features`, the engine's own), and the durations as
    `Timed.durations`, which add up to `frames`."""

    frames: int
    durations: Durations
    frame_samples: int
    features: Any


def check_window(window: Window, frames: int) -> None:
    """`SynthesisFailed` unless `window`'s spans lie inside a segment of `frames` frames, each
    inside the next: its core, the generator's (`decoded`), the body's."""
    start, end = window.decoded
    body_start, body_end = window.body
    inside = 0 <= body_start <= start <= window.start < window.end <= end <= body_end <= frames
    if not inside:
        raise SynthesisFailed(
            f"frames [{body_start}, {body_end}) and [{start}, {end}) around "
            f"[{window.start}, {window.end}) of a segment of {frames}"
        )


class CancelToken:
    """Set from the event loop, read (or hooked) by the engine's worker thread. `deadline`:
    when the call's result is needed (the scheduler's clock, `time.perf_counter`), for an
    engine that orders work of its own (`batcher`); None: as soon as it can. `credit_s`: the
    seconds of the call's run that went to other calls' work, set by an engine that batches
    (a batch's time past what the call's own step takes alone): the scheduler learns the
    call's speed from its time less these, so what it learns stays a call's alone and the
    batch's gain is counted once, by the batch curve (`kokoro_contract.capacity`)."""

    def __init__(self, deadline: float | None = None) -> None:
        self.deadline = deadline
        self.credit_s = 0.0
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback()

    def on_cancel(self, callback: Callable[[], None]) -> None:
        """Run `callback` on cancel (at once if already cancelled)."""
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)
                return
        callback()


class Engine(Protocol):
    """A loaded Kokoro model. `infer` is blocking and thread-safe; the scheduler runs it in a
    worker thread and bounds how many run at once."""

    name: str
    max_phonemes: int

    @property
    def two_passes(self) -> bool:
        """Whether it has `front` and `decode` too (a `ProgressiveEngine`), as loaded."""
        ...

    @property
    def voice_note(self) -> str:
        """A word on its voices for the start log ("": none)."""
        ...

    @property
    def description(self) -> str:
        """What runs where, for people: e.g. "onnx on cpu (2 threads)"."""
        ...

    def voices(self) -> dict[str, str]:
        """Loaded voice names, each with where it came from."""
        ...

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        """Synthesize one segment (at most `max_phonemes`) at 24 kHz; raises
        `SynthesisCancelled` when `cancel` fires mid-run."""
        ...

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        """`infer`, and the duration the model gave each phoneme (for word timings): the same
        audio, sample for sample."""
        ...

    def batch_curve(self) -> dict[str, float] | None:
        """The learned seconds per frame of a batched decoder step by batch size (`GET
        /load`'s `batch_curve`, which admission counts capacity by); None: its work is not
        batched."""
        ...


class Pause(Protocol):
    """Called between the steps of work done ahead (a voice's calibration,
    `StreamPriors.prepare`): returns once it may go on (live work leaves the room, or
    `wanted()` says a request waits for work of this kind now: then at once), or raises to
    stop it."""

    def __call__(self, wanted: Callable[[], bool]) -> None: ...


@runtime_checkable
class ProgressiveEngine(Engine, Protocol):
    """An engine that voices a segment in two passes: `front` over the whole segment, then
    `decode` over windows of its frames, each as soon as it is wanted."""

    @property
    def exact_windows(self) -> bool:
        """Whether `decode` gives any window's core as one call gives those frames, with no
        context (its decoder carries every layer's state): its windows then need none, and
        their sizes change when audio is computed, not its samples."""
        ...

    def front(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Front:
        """The front pass over one segment (at most `max_phonemes`)."""
        ...

    def prepare_voice(self, voice: str, pause: Pause) -> bool:
        """Make ahead what `voice`'s first segment would otherwise wait for (its decoder's
        norm priors: seconds on a CPU, once per voice and cache directory), in the caller's
        thread, calling `pause` between its steps (`Pause`). False: it gave way to a segment
        that waits for another voice's (nothing made; ask again later)."""
        ...

    def decode(self, front: Front, window: Window, cancel: CancelToken) -> FloatAudio:
        """The audio of the frames `window.decoded` of `front` (its core and its context),
        decoded from those frames: `window.frames * front.frame_samples` samples; raises
        `SynthesisCancelled` when `cancel` fires mid-run. A segment's windows are decoded in
        order, each core starting where the one before ended (the first at frame 0): an
        engine may carry what it learns of the segment from window to window."""
        ...


def char_durations(
    phonemes: str, vocab: Mapping[str, int], token_durations: Durations
) -> Durations:
    """Per-token durations of `[pad, *tokenize(phonemes), pad]` as `Timed.durations`: one per
    character of `phonemes` (0 for characters the vocab lacks), with the pads around them."""
    kept = np.fromiter((c in vocab for c in phonemes), dtype=bool, count=len(phonemes))
    token_durations = np.asarray(token_durations, dtype=np.int64).ravel()
    if token_durations.size != int(kept.sum()) + 2:
        raise SynthesisFailed(
            f"{token_durations.size} durations for {int(kept.sum())} phonemes and two pads"
        )
    out = np.zeros(len(phonemes) + 2, np.int64)
    out[0], out[-1] = token_durations[0], token_durations[-1]
    out[1:-1][kept] = token_durations[1:-1]
    return out


def tokenize(phonemes: str, vocab: Mapping[str, int], max_phonemes: int) -> list[int]:
    """Token ids of the phonemes `vocab` knows (others are dropped); never more than
    `max_phonemes` (the splitter guarantees it, so more is a bug)."""
    tokens = [vocab[c] for c in phonemes if c in vocab]
    if len(tokens) > max_phonemes:
        raise SynthesisFailed(f"segment of {len(tokens)} phonemes over {max_phonemes}")
    return tokens


def style_row(n_tokens: int, pack_rows: int) -> int:
    """A voice pack holds one style per phoneme count: the row for `n_tokens`."""
    return min(n_tokens, pack_rows) - 1
