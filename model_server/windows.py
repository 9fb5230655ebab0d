"""Progressive synthesis, pure: which windows of a segment's frames the decoder runs, in what
order, and how their audio is joined.

A segment's front pass gives its length in frames (600 samples, 25 ms, for Kokoro). The decoder
then runs over windows of those frames: each window's *core* is the audio it contributes, and
it is decoded with `context` frames on each side (fewer at the segment's edges), which are cut
off again; the decoder's output near a window's edge is not what the whole segment would give,
so the edges are decoded and thrown away.

The schedule (`plan_windows`): sizes come from a ladder (`first` doubled, up to
`Schedule.largest`). A reply's first segment is needed at once, so its first window is the
smallest (`Schedule.first` frames): the first audio leaves early; a later segment has the audio
before it to play first, and starts with the largest size that is ready in time. Each later
window is at least twice the one before (up to `largest`), or larger: the largest size whose
decoding, at the measured speed, fits in the time before the listener needs its audio. So the
context's share of the compute shrinks window by window, and where synthesis is slower than
playback (or too little audio is ahead yet to pay for a window's context) the wait before
playback can run without a gap stays short. A remainder shorter than `first` (or
`Schedule.remainder`) goes into the window before it. A first segment's first window is
smaller than `first` (down to `Schedule.smallest`) when, at the speed the schedule is designed
for (`Schedule.design`, the int8 graph on 2 CPU cores), every window after it is still decoded
before the audio ahead of it has played (`keeps_ahead`): a short segment speaks sooner, a
long one keeps `first`. That choice reads the segment alone, never the learned speed, so the
same text gives the same windows, and the same bytes, however busy the machine is. The rest
of a segment in one window after the first would cost less compute than doubling, but would
leave a wait before gapless playback nearly as long as one call's (worked out for a long
sentence in docs/measured.md, "Progressive synthesis").

The leading pause: a segment's first frames voice the pad before its first phoneme, silence the
trim cuts to 30 ms, so a first window of `first` frames alone would leave little audio once
trimmed, and the window after it would have to be ready almost at once. So the first window's
core holds that pause, less `Schedule.lead_margin` frames (the speech's onset can start a few
frames before the pad ends), besides its `first` frames: its audio, trimmed, is then much
longer, and the window after it has that much longer to be ready. (Not decoding the pause at
all would save its frames, but the norms' statistics the later windows carry would then lack
it, and one call's level is followed less closely.) The figures are in docs/measured.md,
"2026-12-01 (night)".

The seams (`Joiner`): window k's core is sent as soon as it is decoded, but the first
`crossfade` frames of its right context are kept; window k+1's first `crossfade` frames are
mixed with them by a linear crossfade (`crossfade_weights`) before they leave. So no sample
jumps from one decoding to the other at a seam (a hard cut clicks), and the fade lies inside
window k's context, where its decoding is still good.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kokoro_contract.load import LARGEST_WINDOW_FRAMES

FloatAudio = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Window:
    """Frames `[start, end)` of a segment are this window's audio (its core); the decoder runs
    over `[start - left, end + right)`, its frame-rate layers (the body, which sees further)
    over at least `body_left` and `body_right` frames on each side."""

    start: int
    end: int
    left: int
    right: int
    body_left: int = 0
    body_right: int = 0

    @property
    def decoded(self) -> tuple[int, int]:
        """The frames the decoder's generator runs over, and whose audio it gives."""
        return self.start - self.left, self.end + self.right

    @property
    def body(self) -> tuple[int, int]:
        """The frames the decoder's body runs over: `decoded` and more."""
        return (
            self.start - max(self.left, self.body_left),
            self.end + max(self.right, self.body_right),
        )

    @property
    def frames(self) -> int:
        """How many frames the decoder runs over (its cost)."""
        return self.end - self.start + self.left + self.right


# A reply's first window, in frames, where windows are exact (`ProgressiveEngine.exact_windows`:
# the streamed decoder, whose windows decode nothing twice and have no seams): its audio is
# ready with the stream's first block (16 frames) less the generator's lookahead (5.4 frames),
# so a first window of 8 and the leading pause's frames come from one block: the first audio
# does not wait for the blocks a first window of 24 would need, which short sentences feel most
# (docs/measured.md, "2026-12-06 (night)"). Later windows double as usual, and a remainder
# shorter than the usual first window (24) still joins the window before it.
EXACT_FIRST = 8


@dataclass(frozen=True)
class Schedule:
    """Window sizes, in frames, for Kokoro-82M int8 with the norms' statistics carried. Each window
    is decoded with context on each side, which is decoded only to be thrown away: with none, every
    seam clicks; from a few frames on, the windows' level, spectrum and seams measure alike against
    one call, and the word error rate could not tell 6 frames of context from 12 (docs/measured.md,
    "2026-12-01 (night)" and "2026-12-02: context 6, ..."), so the context is kept small. The
    decoder runs in two parts, each with the context its receptive field needs: its body (the
    frame-rate layers, a small part of its time, reaching about 10 frames each side) sees
    `body_context` frames, its generator (the rest, reaching about 3) `context`. Over the quality
    corpus that misheard no more words than the whole decoder with 6 frames each side, scored alike,
    and decodes fewer generator frames ("2026-12-03 (afternoon)"). 3 frames (75 ms) of crossfade
    leave no click where a hard cut does ("Progressive synthesis")."""

    first: int = 24
    largest: int = LARGEST_WINDOW_FRAMES  # 192, which the gateways' chunk plans expect
    context: int = 3
    body_context: int = 10
    crossfade: int = 3
    margin: float = 0.5  # a window fits when its decoding takes at most this much of the lead
    lead_margin: int = 4  # frames of the leading pause that count as the first window's speech
    # a reply's first window may be as small as `smallest` (in steps of `step`, below
    # `first`) when each window after it is decoded within `gapless` of the audio ahead of it
    # at the design speed (`design`: `per_call` + `per_frame` x frames seconds, the int8
    # decoder's in process on 2 CPU cores). After a first window of 12 frames the seam was
    # brighter than one call's audio at the same point (a click); after one of 16 it measures
    # as one call's (docs/measured.md, "2026-12-02 (morning)")
    smallest: int = 16
    # a segment's last frames shorter than this go into the window before them (None:
    # `first`): a segment's trailing pause (Kokoro gives one up to about 20 frames) is never a
    # window of its own, so its last word's timing comes with the audio it ends in
    remainder: int | None = None
    step: int = 2
    gapless: float = 0.9
    design: tuple[float, float] = (0.045, 0.0118)

    def __post_init__(self) -> None:
        if not 0 < self.first <= self.largest or self.smallest <= 0:
            raise ValueError("window sizes must be 0 < first <= largest and 0 < smallest")
        if self.step < 1 or not 0 < self.gapless <= 1:
            raise ValueError("step must be >= 1 and 0 < gapless <= 1")
        if not 0 <= self.crossfade <= self.context:
            raise ValueError("the crossfade lies inside the context: 0 <= crossfade <= context")
        if self.lead_margin < 0:
            raise ValueError("lead_margin must be >= 0")
        if self.body_context < 0:
            raise ValueError("body_context must be >= 0")

    @property
    def sizes(self) -> tuple[int, ...]:
        """The ladder of core sizes: `first` doubled until `largest`."""
        sizes = [self.first]
        while sizes[-1] * 2 <= self.largest:
            sizes.append(sizes[-1] * 2)
        return tuple(sizes)


@dataclass(frozen=True)
class Speed:
    """How long decoding takes: `per_call` + `per_frame` x frames decoded, in seconds; and how
    long one frame plays."""

    per_call: float
    per_frame: float
    frame_s: float

    def seconds(self, frames: int) -> float:
        return self.per_call + self.per_frame * frames


def lead_in(pause: int, schedule: Schedule) -> int:
    """The frames the first window's core holds besides its `first` frames of speech: those of
    the `pause` frames before the first phoneme that come before `schedule.lead_margin`."""
    return max(0, pause - schedule.lead_margin)


def plan_windows(
    frames: int, schedule: Schedule, speed: Speed, lead_s: float = 0.0, pause: int = 0
) -> tuple[Window, ...]:
    """The windows of a segment of `frames` frames, in order: cores that tile `[0, frames)`.
    `lead_s`: how long until the listener needs the segment's first audio, from when its
    first window starts (0 or less: at once, as for a reply's first segment; a later segment
    has the audio before it to play first, and so may start with a larger window); `pause`:
    the frames of the pad before its first phoneme, which the first core holds besides its
    size (`lead_in`). Needed at once, the first window is the smallest size from
    `schedule.smallest` up to `schedule.first` after which the playback keeps ahead at the
    design speed (`keeps_ahead`), else `first`."""
    first = schedule.first
    if lead_s <= 0:
        design = Speed(*schedule.design, speed.frame_s)
        for size in range(min(schedule.smallest, schedule.first), schedule.first, schedule.step):
            if keeps_ahead(
                _plan(frames, schedule, design, 0.0, pause, size), schedule, design, pause
            ):
                first = size
                break
    return _plan(frames, schedule, speed, lead_s, pause, first)


def keeps_ahead(
    windows: tuple[Window, ...], schedule: Schedule, speed: Speed, pause: int = 0
) -> bool:
    """Whether, at `speed`, each window after the first is decoded within `schedule.gapless`
    of the audio before it, counted from when the first window's audio starts to play: its
    core less the part of the pause the trim cuts (`lead_in`), and every later core whole."""
    ready = 0.0  # seconds after the first audio that the next window is decoded
    ahead = 0.0  # seconds of audio before it
    for number, window in enumerate(windows):
        if number:
            ready += speed.seconds(window.frames)
            if ready > schedule.gapless * ahead:
                return False
        cut = lead_in(pause, schedule) if number == 0 else 0
        ahead += (window.end - window.start - cut) * speed.frame_s
    return True


def _plan(
    frames: int, schedule: Schedule, speed: Speed, lead_s: float, pause: int, first: int
) -> tuple[Window, ...]:
    """`plan_windows` with a first window of `first` frames (besides the lead-in) when one is
    needed at once."""

    def window(start: int, core: int) -> Window:
        remainder = schedule.first if schedule.remainder is None else schedule.remainder
        if frames - (start + core) < remainder:
            core = frames - start  # a short remainder: into this window
        end = start + core
        context, body = schedule.context, schedule.body_context
        return Window(
            start,
            end,
            min(context, start),
            min(context, frames - end),
            min(body, start),
            min(body, frames - end),
        )

    windows: list[Window] = []
    start = 0
    ahead = lead_s  # seconds until the listener needs the audio of the next window
    size = 0  # the size of the window before (the first's without its lead-in)
    while start < frames:
        pad = 0 if windows else lead_in(pause, schedule)
        fitting = [
            larger
            for larger in schedule.sizes
            if larger >= size
            and speed.seconds(window(start, larger + pad).frames) <= schedule.margin * ahead
        ]
        # at least twice the one before (the first: `first`), so the context's share shrinks
        # and the wait before playback can run without a gap stays short even when synthesis
        # falls behind; larger when the speed says a larger one is ready in time
        grown = min(schedule.largest, 2 * size) if windows else first
        size = max(fitting[-1] if fitting else 0, grown)
        chosen = window(start, size + pad)
        size = max(size, schedule.first)  # a smaller first: the ladder goes on from `first`
        ahead = max(0.0, ahead - speed.seconds(chosen.frames))
        ahead += (chosen.end - chosen.start) * speed.frame_s
        windows.append(chosen)
        start = chosen.end
    return tuple(windows)


def crossfade_weights(samples: int) -> FloatAudio:
    """The weights of the incoming window's audio over a crossfade of `samples` samples:
    rising linearly, strictly between 0 and 1 (the outgoing window's are 1 minus these)."""
    return ((np.arange(samples, dtype=np.float64) + 0.5) / samples).astype(np.float32)


class Joiner:
    """One segment's windows in, the segment's audio out, piece by piece: `push` each window's
    decoded audio (all of `window.decoded`, in order) and get the samples that are final."""

    def __init__(self, frame_samples: int, crossfade: int) -> None:
        self.frame_samples = frame_samples
        self.crossfade = crossfade
        self._tail: FloatAudio = np.zeros(0, np.float32)  # the last window's faded-out frames
        self._end = 0  # the frame the last window's core ended at

    def push(self, window: Window, audio: FloatAudio) -> FloatAudio:
        """The audio of `window`'s core, its first frames crossfaded with the previous
        window's right context."""
        n = self.frame_samples
        if window.start != self._end:
            raise ValueError(f"window at frame {window.start} after one ending at {self._end}")
        if audio.size != window.frames * n:
            raise ValueError(f"{audio.size} samples for a window of {window.frames} frames")
        core = audio[window.left * n : (window.left + window.end - window.start) * n].copy()
        fade = min(self._tail.size, core.size)
        if fade:
            weights = crossfade_weights(self._tail.size)[:fade]
            core[:fade] = weights * core[:fade] + (1 - weights) * self._tail[:fade]
        keep = min(self.crossfade, window.right) * n
        after = (window.left + window.end - window.start) * n
        self._tail = audio[after : after + keep].astype(np.float32, copy=True)
        self._end = window.end
        return core
