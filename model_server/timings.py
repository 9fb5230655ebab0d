"""Word timings for one request, pure: the frames the model gave each phoneme, read through the
word map, in the audio actually sent.

A request's phonemes are cut into segments (`text/split.py`); each segment is one engine call,
trimmed (`audio.TrimPolicy`) and sent. For each segment, `WordClock.segment` gives the words
that end in it: a word starts at its first voiced phoneme's first frame and ends at its last
voiced phoneme's last frame, held inside the audible part that trimming found, minus what
trimming cut at the segment's front, plus the samples the request sent before the segment.
Times are seconds from the request's first audio sample. Pauses (spaces, punctuation, the
model's pads) fall between words. A phrase's last phoneme often holds the frames of the pause
after it, which the voice has already faded out of: a word whose last 150 ms or more are
silent (by the trimming threshold) ends where its sound does. A word cut across segments (only
a sentence too long for one engine call can do that) is reported once, with the segment where
it ends, from where it began.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kokoro_contract.audio import SAMPLE_RATE
from kokoro_contract.protocol import WordTiming
from model_server.audio import TrimPolicy
from model_server.engines.base import Timed
from model_server.text.words import WordMap

# A silence this long at the end of a word's frames is a pause, not a stop's closure (50-100
# ms): Kokoro often gives a phrase's last phoneme the frames of the pause after it.
PAUSE_S = 0.15


def locate(phonemes: str, segments: Sequence[str]) -> list[list[int]]:
    """For every character of every segment, its index in `phonemes`: the segments are
    `phonemes` in order, cut where `split_phonemes` cut it (a run of whitespace there may be
    gone, or one space)."""
    located: list[list[int]] = []
    pos = 0
    for segment in segments:
        where = []
        for char in segment:
            if char.isspace():
                where.append(pos if pos < len(phonemes) else len(phonemes) - 1)
                if pos < len(phonemes) and phonemes[pos].isspace():
                    pos += 1
                continue
            while pos < len(phonemes) and phonemes[pos].isspace():
                pos += 1
            if pos >= len(phonemes) or phonemes[pos] != char:
                raise ValueError(f"segment {len(located)} is not the phonemes' next piece")
            where.append(pos)
            pos += 1
        located.append(where)
    return located


class WordClock:
    """The word timings of one request's segments, segment by segment, in order."""

    def __init__(self, words: WordMap, segments: Sequence[str], trim: TrimPolicy) -> None:
        self._words = words
        self._where = locate(words.phonemes, segments)
        self._trim = trim
        self._next = 0  # the first word not reported yet
        self._started: float | None = None  # its start, when it began in an earlier segment

    def segment(
        self, index: int, timed: Timed, sent: int, complete: bool = True
    ) -> list[WordTiming]:
        """The words that end in segment `index`: `timed` is its engine output (before
        trimming), `sent` the samples of the request sent before it. With `complete` false,
        `timed.audio` is only the segment's audio so far (progressive synthesis): the words
        whose timings that audio already settles, the same as the whole audio would give; the
        others come with a later call for the same segment."""
        where = self._where[index]
        if not where:
            return []
        at = {p: c for c, p in enumerate(where)}
        frames = np.asarray(timed.durations, np.int64)
        ends = (int(frames[0]) + np.cumsum(frames[1:-1])) * timed.frame_samples
        starts = ends - frames[1:-1] * timed.frame_samples
        loud = np.flatnonzero(np.abs(timed.audio) > self._trim.threshold)
        if not complete and loud.size == 0:
            return []  # where the speech starts (and so the trimming) is not known yet
        cut, _ = self._trim.bounds(timed.audio)
        # nothing audible: the segment is trimmed to nothing, and its words last nothing
        first_loud, past_loud = (int(loud[0]), int(loud[-1]) + 1) if loud.size else (0, 0)

        def seconds(sample: int) -> float:
            return (sent + min(max(sample, first_loud), past_loud) - cut) / SAMPLE_RATE

        def heard_until(start: int, end: int) -> int:
            """Past the last audible sample in [start, end), or `end` when none is (a word
            that is all silence keeps its frames)."""
            i = int(np.searchsorted(loud, end)) - 1
            return int(loud[i]) + 1 if i >= 0 and loud[i] >= start else end

        last = where[-1]
        out = []
        spans, words = self._words.spans, self._words.words
        while self._next < len(spans):
            first, end = spans[self._next]
            if first > last:
                break  # in a later segment
            if not complete:
                if end - 1 > last or int(ends[at[end - 1]]) > timed.audio.size:
                    break  # ends in audio not decoded yet
                finished = int(ends[at[end - 1]])
                heard = heard_until(int(starts[at[first]]) if first >= where[0] else 0, finished)
                if finished - heard >= PAUSE_S * SAMPLE_RATE:
                    finished = heard
                if finished > past_loud:
                    break  # held by where the speech ends, not known yet
            if self._started is None:
                self._started = seconds(int(starts[at[first]]))
            if end - 1 > last:
                break  # goes on in the next segment
            finished = int(ends[at[end - 1]])
            heard = heard_until(int(starts[at[first]]) if first >= where[0] else 0, finished)
            if finished - heard >= PAUSE_S * SAMPLE_RATE:  # its last frames are a pause
                finished = heard
            out.append(WordTiming(words[self._next], self._started, seconds(finished)))
            self._started = None
            self._next += 1
        return out
