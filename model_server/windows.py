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
same text gives the same windows, and the same bytes, however busy the machine is. Worked
out for a 430-frame (10.8 s) sentence at RTF 0.5 with 12 frames of context (24, 48, 96, 192,
70 frames): gapless playback could start 1.35 s after the request, at 1.22x the decoder
compute of one call (with 6 frames, 1.11x); with the rest in one window after the first,
5.1 s at 1.06x; one call, 5.4 s.

The leading pause: a segment's first frames voice the pad before its first phoneme (13-17
frames of Kokoro's output over the quality corpus), silence the trim cuts to 30 ms. So the first
window's core holds that pause, less `Schedule.lead_margin` frames (the speech's onset starts up
to 4.6 frames before the pad ends), besides its `first` frames: its audio, trimmed, is then
0.55-0.63 s rather than 0.27-0.30 s (9 frames of speech), and the window after it has that much
longer to be ready. (Not decoding the pause at all would save its frames, but the norms'
statistics the later windows carry would then lack it: one call's level was followed less
closely, 1.82 against 1.23 dB on the fox of tests/model_server/test_progressive.py.)

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
# so a first window of 8 and the leading pause's frames come from one block. In process, 2
# cores, medians of 3 (docs/measured.md, 2026-12-06 night): "Hello there." first audio 255 ms
# against 460 with 24, a 9 s sentence 526 ms against 622. Later windows double as usual, and
# a remainder shorter than the usual first window (24) still joins the window before it.
EXACT_FIRST = 8


@dataclass(frozen=True)
class Schedule:
    """Window sizes, in frames. Measured on Kokoro-82M int8 with the norms' statistics carried
    (docs/measured.md, 2026-12-01 and 2026-12-02): with 4 to 12 frames of context each side the
    windows' level, spectrum and seams measure alike against one call (no context: a click at
    every seam); PocketSphinx's word error rate, context 6 less context 12, per sentence over
    the corpus, 3 voices and 2 window layouts: -0.044 to +0.026, mean -0.001, no 95 % interval
    excluding 0 on the side of 12, as much as the layouts alone move it. The context was then
    6; 3 frames (75 ms) of crossfade leave no click where a hard cut does. Since 2026-12-03 the
    decoder runs in two parts: its body (frame-rate layers, about 5 % of its time, a receptive
    field of about 10 frames each side) sees `body_context` frames, its generator (the rest, a
    receptive field of about 3) `context`: over the corpus, every sentence a reply's first
    segment (jm_kumo, in process), body 10 / generator 3 misheard 95 of 430 words, 10 / 2 96,
    the whole decoder at 6 101, one call 86; MOS 4.099 / 4.092 / 4.103 / 4.101, and 6.5 % fewer
    generator frames than 6."""

    first: int = 24
    largest: int = LARGEST_WINDOW_FRAMES  # 192, which the gateways' chunk plans expect
    context: int = 3
    body_context: int = 10
    crossfade: int = 3
    margin: float = 0.5  # a window fits when its decoding takes at most this much of the lead
    lead_margin: int = 4  # frames of the leading pause that count as the first window's speech
    # a reply's first window may be as small as `smallest` (in steps of `step`, below
    # `first`) when each window after it is decoded within `gapless` of the audio ahead of it
    # at the design speed: `per_call` + `per_frame` x frames seconds, as measured in process
    # for the int8 decoder on 2 cores. A 12-frame first window's seam measured HF 3.15 over
    # the corpus (one call 0.14 there), 16's 1.70 (one call 1.70)
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
