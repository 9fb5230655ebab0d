"""Progressive synthesis, the pure parts: the window schedule and the seams (windows.py), the
trimming of audio that arrives in pieces (audio.StreamTrim), word timings from a segment's
audio so far (timings.WordClock), and the seam detector (quality/seams.py)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kokoro_contract.protocol import WordTiming
from model_server.audio import StreamTrim, TrimPolicy
from model_server.engines.base import Timed
from model_server.text.words import WordMap
from model_server.timings import WordClock
from model_server.windows import (
    Joiner,
    Schedule,
    Speed,
    Window,
    crossfade_weights,
    keeps_ahead,
    lead_in,
    plan_windows,
)
from quality import seams

RATE = 24_000
FAST = Speed(per_call=0.0, per_frame=0.001, frame_s=0.025)  # RTF 0.04: any window fits
SLOW = Speed(per_call=0.0, per_frame=0.0125, frame_s=0.025)  # RTF 0.5
SCHEDULE = Schedule(first=24, largest=96, context=12, body_context=0, crossfade=3)

# --- the schedule ------------------------------------------------------------------------------


def test_the_ladder_of_sizes_doubles_from_the_first_to_the_largest() -> None:
    assert SCHEDULE.sizes == (24, 48, 96)
    assert Schedule(first=20, largest=100).sizes == (20, 40, 80)
    assert Schedule(first=8, largest=8).sizes == (8,)


def test_a_bad_schedule_is_refused() -> None:
    with pytest.raises(ValueError, match="window sizes"):
        Schedule(first=0)
    with pytest.raises(ValueError, match="window sizes"):
        Schedule(first=48, largest=24)
    with pytest.raises(ValueError, match="inside the context"):
        Schedule(context=2, crossfade=3)  # the crossfade lies inside the context


def test_fast_decoding_gets_a_small_first_window_then_the_largest() -> None:
    assert plan_windows(400, SCHEDULE, FAST) == (
        Window(0, 24, 0, 12),
        Window(24, 120, 12, 12),
        Window(120, 216, 12, 12),
        Window(216, 312, 12, 12),
        Window(312, 400, 12, 0),  # 88 frames: a remainder under 24 went into it
    )


def test_windows_grow_as_the_audio_ahead_of_the_listener_grows() -> None:
    # RTF 0.2: after the first window's 0.6 s, a 48-frame window (72 decoded, 0.36 s) fits in
    # 80 % of the lead, a 96-frame one (0.6 s) does not; after it, the lead is 1.44 s
    medium = Speed(per_call=0.0, per_frame=0.005, frame_s=0.025)
    assert plan_windows(200, SCHEDULE, medium) == (
        Window(0, 24, 0, 12),
        Window(24, 72, 12, 12),
        Window(72, 168, 12, 12),
        Window(168, 200, 12, 0),
    )


def test_each_window_is_at_least_twice_the_one_before() -> None:
    # RTF 0.5 with 24 frames of context: even 24 frames (0.6 s to decode 48) miss the 0.48 s;
    # the windows double all the same
    assert plan_windows(100, SCHEDULE, SLOW) == (
        Window(0, 24, 0, 12),
        Window(24, 72, 12, 12),
        Window(72, 100, 12, 0),
    )
    sizes = [w.end - w.start for w in plan_windows(1_000, SCHEDULE, SLOW)]
    assert sizes == [24, 48, *[96] * 9, 64]  # up to the largest, 96 here
    wider = Schedule(first=24, largest=192, context=12, body_context=0, crossfade=3)
    assert [w.end - w.start for w in plan_windows(430, wider, SLOW)] == [24, 48, 96, 192, 70]


def test_a_remainder_shorter_than_its_threshold_joins_the_window_before_it() -> None:
    # an exact engine's schedule: 8 frames first, and the trailing pause (under 24 frames)
    # never a window of its own, so the last word's timing comes with the audio it ends in
    exact = Schedule(first=8, smallest=8, remainder=24, context=0, body_context=0, crossfade=0)
    ends = [w.end for w in plan_windows(8 + 16 + 32 + 20, exact, SLOW)]
    assert ends == [8, 24, 76]  # 20 frames left after 56: into the third window
    assert [w.end for w in plan_windows(8 + 16 + 32 + 24, exact, SLOW)] == [8, 24, 56, 80]
    # without it, the remainder is measured against `first`
    ends = [w.end for w in plan_windows(76, replace(exact, remainder=None), SLOW)]
    assert ends == [8, 24, 56, 76]


def test_a_segment_with_audio_before_it_starts_with_a_larger_window() -> None:
    # 1 s before the listener needs it: 96 frames (108 decoded, 0.108 s) fit in 0.8 s
    assert plan_windows(400, SCHEDULE, FAST, lead_s=1.0) == (
        Window(0, 96, 0, 12),
        Window(96, 192, 12, 12),
        Window(192, 288, 12, 12),
        Window(288, 400, 12, 0),
    )
    # a late segment (its deadline passed) is like a first one
    assert plan_windows(400, SCHEDULE, FAST, lead_s=-2.0)[0] == Window(0, 24, 0, 12)


def test_a_per_call_cost_counts_against_a_window() -> None:
    # after 24 frames: 96 (0.2 + 120 x 0.005 = 0.8 s) does not fit in the 0.48 s, as it would
    # without a cost per call (0.6 s after 48 frames of 1.2 s)
    costly = Speed(per_call=0.2, per_frame=0.005, frame_s=0.025)
    assert plan_windows(300, SCHEDULE, costly)[2] == Window(72, 168, 12, 12)
    assert plan_windows(300, SCHEDULE, costly)[1] == Window(24, 72, 12, 12)


def test_a_short_segment_is_one_window_without_context() -> None:
    assert plan_windows(30, SCHEDULE, FAST) == (Window(0, 30, 0, 0),)
    assert plan_windows(24, SCHEDULE, FAST) == (Window(0, 24, 0, 0),)
    assert plan_windows(0, SCHEDULE, FAST) == ()


def test_the_first_core_holds_the_leading_pause_besides_its_frames_of_speech() -> None:
    # a 400-frame segment whose pad before the first phoneme lasts 15 frames: the first core
    # holds 11 of them (all but the 4 of the margin) and 24 more; the ladder goes on from 24
    windows = plan_windows(400, SCHEDULE, SLOW, pause=15)
    assert windows[:3] == (Window(0, 35, 0, 12), Window(35, 83, 12, 12), Window(83, 179, 12, 12))
    assert windows[-1].end == 400
    assert lead_in(15, SCHEDULE) == 11
    assert lead_in(4, SCHEDULE) == 0  # a pause no longer than the margin adds nothing
    assert plan_windows(50, SCHEDULE, FAST, pause=15) == (Window(0, 50, 0, 0),)  # 35 + 15 < 24
    # a later segment's first window, as large as its lead lets it be, holds its pause too
    assert plan_windows(400, SCHEDULE, FAST, lead_s=1.0, pause=15)[0] == Window(0, 107, 0, 12)


def test_a_short_first_segment_opens_with_a_smaller_window_whatever_the_learned_speed() -> None:
    """A first segment of "Hello there." (62 frames, a 15-frame pause): after 20 frames of
    speech the rest (31, 34 decoded with 3 of context) is ready, at the design speed (45 ms +
    11.8 ms a frame: 0.446 s), within 90 % of the 0.50 s ahead of it; after 18 it is not
    (0.47 s of 0.41 s). So it opens with 20, at any learned speed: the same text gives the same
    windows. A long segment keeps 24; a later one (audio before it) is planned as before. The
    body sees 10 frames where the segment has them."""
    schedule = Schedule()
    assert (schedule.smallest, schedule.first, schedule.design) == (16, 24, (0.045, 0.0118))
    assert (schedule.context, schedule.body_context) == (3, 10)
    design = Speed(*schedule.design, 0.025)
    hello = (Window(0, 31, 0, 3, 0, 10), Window(31, 62, 3, 0, 10, 0))
    assert keeps_ahead(hello, schedule, design, pause=15)
    assert not keeps_ahead((Window(0, 29, 0, 3), Window(29, 62, 3, 0)), schedule, design, 15)
    for learned in (FAST, SLOW, Speed(0.3, 0.05, 0.025)):
        assert plan_windows(62, schedule, learned, pause=15) == hello
        assert plan_windows(430, schedule, learned, pause=15)[0] == Window(0, 35, 0, 3, 0, 10)
    assert plan_windows(62, schedule, SLOW, lead_s=0.5, pause=15)[0] == Window(0, 35, 0, 3, 0, 10)
    # a fast design (a GPU's) opens every first segment with the smallest
    quick = Schedule(design=(0.01, 0.0005))
    assert plan_windows(430, quick, SLOW, pause=15)[0] == Window(0, 27, 0, 3, 0, 10)


def test_keeps_ahead_counts_from_the_first_audio_less_the_trimmed_pause() -> None:
    schedule = Schedule(gapless=1.0)
    one_a_frame = Speed(0.0, 0.025, 0.025)  # decoding takes as long as playing
    # 10 frames of audio ahead (14 less the 4 of the pause the trim cuts): 10 decoded fit
    assert keeps_ahead((Window(0, 14, 0, 0), Window(14, 24, 0, 0)), schedule, one_a_frame, 8)
    assert not keeps_ahead((Window(0, 14, 0, 0), Window(14, 25, 0, 0)), schedule, one_a_frame, 8)
    assert keeps_ahead((Window(0, 30, 0, 0),), schedule, one_a_frame)  # one window: no wait


@settings(max_examples=200, deadline=None)
@given(
    st.integers(1, 2_000),
    st.sampled_from([FAST, SLOW, Speed(0.05, 0.004, 0.025)]),
    st.integers(1, 40),
    st.integers(0, 20),
    st.integers(0, 30),
    st.integers(0, 20),
)
def test_cores_tile_the_segment_and_context_stays_inside_it(
    frames: int, speed: Speed, first: int, context: int, pause: int, body: int
) -> None:
    schedule = Schedule(
        first=first, largest=first * 8, context=context, body_context=body, crossfade=0
    )
    windows = plan_windows(frames, schedule, speed, pause=pause)
    assert windows[0].start == 0
    assert windows[-1].end == frames
    for before, after in itertools.pairwise(windows):
        assert before.end == after.start
    pad = lead_in(pause, schedule)
    smallest = min(schedule.smallest, first)  # a first window may be smaller than `first`
    for window in windows:
        start, end = window.decoded
        assert 0 <= start < window.start + 1
        assert window.end <= end <= frames
        assert window.left == min(context, window.start)
        assert window.right == min(context, frames - window.end)
        # the body sees at least what the generator does, as far as the segment goes
        body_start, body_end = window.body
        assert body_start == window.start - min(max(context, body), window.start)
        assert body_end == window.end + min(max(context, body), frames - window.end)
        opening = window is windows[0]
        assert window.end - window.start >= min(smallest if opening else first, frames)
        size = window.end - window.start - (pad if opening else 0)
        assert (
            size in schedule.sizes
            or window is windows[-1]
            or (opening and smallest <= size < first and (size - smallest) % schedule.step == 0)
        )


# --- the seams ---------------------------------------------------------------------------------


def test_crossfade_weights_rise_linearly_strictly_inside_zero_and_one() -> None:
    assert crossfade_weights(4).tolist() == [0.125, 0.375, 0.625, 0.875]
    assert crossfade_weights(1).tolist() == [0.5]
    assert crossfade_weights(0).tolist() == []


def test_a_window_is_cropped_and_crossfaded_into_the_previous_ones_context() -> None:
    joiner = Joiner(frame_samples=2, crossfade=2)
    # window 1: frames [0, 3) with 2 frames of right context, all 1.0
    first = joiner.push(Window(0, 3, 0, 2), np.ones(10, np.float32))
    assert first.tolist() == [1.0] * 6
    # window 2: frames [3, 6), 2 frames of left context, all 0.0: its first 2 frames (4 samples)
    # fade in over window 1's right context
    second = joiner.push(Window(3, 6, 2, 0), np.zeros(10, np.float32))
    assert second.tolist() == [0.875, 0.625, 0.375, 0.125, 0.0, 0.0]


def test_a_hard_cut_without_crossfade_is_plain_cropping() -> None:
    joiner = Joiner(frame_samples=1, crossfade=0)
    audio = np.arange(12, dtype=np.float32)
    assert joiner.push(Window(0, 4, 0, 2), audio[:6]).tolist() == [0, 1, 2, 3]
    assert joiner.push(Window(4, 8, 2, 0), audio[2:8] + 100).tolist() == [104, 105, 106, 107]


def test_windows_that_decode_alike_join_into_the_whole() -> None:
    whole = np.sin(np.arange(60, dtype=np.float32) / 3)
    joiner = Joiner(frame_samples=3, crossfade=1)
    pieces = []
    for window in plan_windows(20, Schedule(first=4, largest=8, context=2, crossfade=1), FAST):
        start, end = window.decoded
        pieces.append(joiner.push(window, whole[start * 3 : end * 3]))
    assert np.allclose(np.concatenate(pieces), whole, atol=1e-6)


def test_windows_out_of_order_or_of_the_wrong_size_are_bugs() -> None:
    joiner = Joiner(frame_samples=2, crossfade=1)
    with pytest.raises(ValueError, match="after one ending at 0"):
        joiner.push(Window(2, 4, 0, 0), np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="8 samples for a window of 5 frames"):
        joiner.push(Window(0, 4, 0, 1), np.zeros(8, np.float32))


# --- trimming as the audio comes ---------------------------------------------------------------

TINY = TrimPolicy(threshold=0.5, lead_s=2 / RATE, tail_s=3 / RATE)  # 2 and 3 samples


def test_streamed_trimming_keeps_what_is_certain_and_holds_a_long_pause() -> None:
    trim = StreamTrim(TINY)
    assert trim.push(np.array([0, 0, 0, 0], np.float32)).tolist() == []
    # the first loud sample at 4: the lead from 2; the tail pause (3 samples) goes at once,
    # the rest of the quiet run waits
    assert trim.push(np.array([1, 0, 0, 0, 0, 0], np.float32)).tolist() == [0, 0, 1, 0, 0, 0]
    assert trim.cut == 2
    # speech again: the held pause goes before it
    assert trim.push(np.array([1, 0], np.float32)).tolist() == [0, 0, 1, 0]
    assert trim.flush().tolist() == [0, 0]  # the tail, padded past the audio's end


def test_streamed_trimming_of_silence_is_nothing() -> None:
    trim = StreamTrim(TINY)
    assert trim.push(np.zeros(5, np.float32)).tolist() == []
    assert trim.flush().tolist() == []


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.0, 0.0, 0.2, 0.9, -0.9]), max_size=80),
    st.lists(st.integers(1, 9), min_size=1, max_size=20),
)
def test_streamed_trimming_is_trimming_the_whole(values: list[float], cuts: list[int]) -> None:
    audio = np.array(values, np.float32)
    trim = StreamTrim(TINY)
    out, at = [], 0
    for n in cuts * 10:
        if at >= audio.size:
            break
        out.append(trim.push(audio[at : at + n]))
        at += n
    out.append(trim.push(audio[at:]))
    out.append(trim.flush())
    assert np.concatenate(out).tolist() == TINY.apply(audio).tolist()
    assert trim.cut == TINY.bounds(audio)[0]


# --- word timings from the audio so far --------------------------------------------------------


def test_words_come_as_the_audio_that_settles_them_does_and_match_the_whole() -> None:
    phonemes = "ab cd ef"
    words = WordMap(phonemes, ("ab", "cd", "ef"), ((0, 2), (3, 5), (6, 8)))
    # 600 samples a frame: pad 1 | a 1 | b 10 | space 1 | c 1 | d 3 | space 1 | e 1 | f 1 | pad 1
    durations = np.array([1, 1, 10, 1, 1, 3, 1, 1, 1, 1], np.int64)
    audio = np.zeros(int(durations.sum()) * 600, np.float32)
    for start, end in [(600, 2_000), (7_800, 9_000), (10_800, 12_000)]:
        audio[start:end] = 0.5
    trim = TrimPolicy(lead_s=0)
    whole = WordClock(words, [phonemes], trim).segment(0, Timed(audio, durations, 600), sent=0)

    clock = WordClock(words, [phonemes], trim)
    got = []
    for upto, expected in [(500, 0), (7_300, 1), (10_300, 1), (12_000, 3)]:
        partial = clock.segment(0, Timed(audio[:upto], durations, 600), sent=0, complete=False)
        got += partial
        assert len(got) == expected, upto
    # at 10,300 "cd" (ending at 10,200) is past the last loud sample so far (9,000): where the
    # speech ends could still hold it, until speech comes after it; the end adds nothing more
    assert clock.segment(0, Timed(audio, durations, 600), sent=0, complete=True) == []
    assert got == whole
    assert [w.word for w in got] == ["ab", "cd", "ef"]
    assert got[1] == WordTiming("cd", (7_800 - 600) / RATE, (10_200 - 600) / RATE)


# --- the seam detector -------------------------------------------------------------------------


def _voice(seconds: float) -> seams.Samples:
    t = np.arange(int(seconds * RATE)) / RATE
    envelope = 0.3 + 0.2 * np.sin(2 * np.pi * 3 * t)
    wave = envelope * np.sin(2 * np.pi * 180 * t + 2 * np.sin(2 * np.pi * 5 * t))
    return np.asarray(wave, np.float32)


def test_the_seam_detector_finds_a_click_and_a_level_step_and_passes_a_smooth_join() -> None:
    audio = _voice(2.0)
    smooth = seams.seams(audio, [RATE // 2, RATE])
    assert smooth.worst_jump < 1.1
    assert smooth.worst_hf < 1.5
    assert smooth.worst_level_db < 1.5
    clicked = audio.copy()
    at = RATE // 2 + 30  # near a crest of the 180 Hz wave
    clicked[at:] = -clicked[at:]  # a hard cut to the other phase: a step
    report = seams.seams(clicked, [at])
    assert report.worst_jump > 2
    assert report.worst_hf > 2
    stepped = audio.copy()
    stepped[RATE:] *= 0.4  # 8 dB down from one sample to the next
    assert seams.seams(stepped, [RATE]).worst_level_db > 2


def test_in_a_fricative_the_seam_detector_hears_a_click_but_not_the_hiss() -> None:
    rng = np.random.default_rng(1)
    audio = _voice(2.0)
    hiss = slice(RATE // 2, RATE // 2 + RATE // 10)  # 100 ms of an /s/, 20 dB under the voice
    audio[hiss] = rng.normal(0, 0.1 * float(np.std(audio)), RATE // 10).astype(np.float32)
    at = RATE // 2 + RATE // 20  # in its middle
    # far brighter than the voiced spans of its level, no brighter than the hiss around it
    assert seams.seams(audio, [at]).worst_hf < 1.5
    clicked = audio.copy()
    clicked[at : at + 2] += float(np.abs(audio).max())  # a click in it, as loud as the voice
    assert seams.seams(clicked, [at]).worst_hf > 2
    assert seams.seams(clicked, [at]).worst_jump > 2
    faint = audio.copy()
    faint[at : at + 2] += 0.5 * float(np.abs(audio).max())  # half as loud: lost in the hiss's
    assert seams.seams(faint, [at]).worst_hf < 2  # brightness, but a step all the same
    assert seams.seams(faint, [at]).worst_jump > 2


def test_in_a_pause_the_seam_detector_hears_a_click_but_not_the_noise_floor() -> None:
    rng = np.random.default_rng(0)
    t = np.arange(RATE // 2) / RATE
    pause = (3e-4 * np.sin(2 * np.pi * 100 * t)).astype(np.float32)  # 70 dB down: a hum
    pause[RATE // 4 : RATE // 4 + 200] = rng.normal(0, 3e-4, 200).astype(np.float32)  # hiss
    audio = np.concatenate([_voice(1.0), pause, _voice(1.0)])
    at = RATE + RATE // 4 + 100
    # as bright as white noise against a hum of its level, but 70 dB down: nothing to hear
    assert seams.seams(audio, [at]).worst_hf < 1
    clicked = audio.copy()
    clicked[at : at + 3] = 0.2  # a click in the pause: a step
    assert seams.seams(clicked, [at]).worst_jump > 2
