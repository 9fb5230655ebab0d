"""Window layouts at a fixed speed, in process: what the decoder's windows cost in words heard,
against one engine call per segment and against the frames they decode.

A model server's windows follow the speed it measured and the lead each segment has, so its
corpus WER moves from run to run with the machine (docs/measured.md, 2026-12-04 evening).
Here each layout is chosen from the segment alone (`windows.plan_windows` at the schedule's
design speed, with a lead that is fixed per layout), so the same code gives the same audio on
any machine, and layouts can be compared side by side: the default schedule as a reply's
first segment (needed at once: the smallest first window, then the ladder), the same with
wider context, and with a lead so long that every window is as large as the schedule allows.
The audio is what the server sends: windows joined (`Joiner`), trimmed as they come
(`StreamTrim`), PCM s16le; the text takes the server's path (G2P, `split_phonemes`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from kokoro_contract.audio import SAMPLE_RATE
from model_server.audio import StreamTrim, TrimPolicy, to_pcm16
from model_server.engines.base import CancelToken, FloatAudio
from model_server.engines.onnx import OnnxEngine, OnnxOptions
from model_server.text.g2p import english_g2p
from model_server.text.split import split_phonemes
from model_server.windows import Joiner, Schedule, Speed, plan_windows

DEFAULT = Schedule()


@dataclass(frozen=True)
class Layout:
    label: str
    schedule: Schedule | None  # None: one engine call per segment
    lead_s: float = 0.0  # each segment's lead (0: needed at once, as a reply's first)


LAYOUTS = (
    Layout("one call per segment", None),
    Layout("windows, needed at once (the default schedule)", DEFAULT),
    Layout(
        "windows, needed at once, context 6",
        dataclasses.replace(DEFAULT, context=6),
    ),
    Layout(
        "windows, needed at once, context 8, body 16",
        dataclasses.replace(DEFAULT, context=8, body_context=16),
    ),
    Layout("windows, a long lead (the largest that fit)", DEFAULT, lead_s=100.0),
)


@dataclass(frozen=True)
class Voiced:
    pcm: bytes  # one reply's PCM s16le, 24 kHz
    windows: int
    frames: int  # frames the decoder ran over (its generator's: with context)


class LayoutSynth:
    """The onnx engine in this process (2 threads), voicing replies under a layout."""

    def __init__(self, voice: str) -> None:
        self.voice = voice
        self.engine = OnnxEngine(OnnxOptions(intra_op_threads=2))
        self.g2p = english_g2p()
        self.trim = TrimPolicy()

    def reply(self, text: str, layout: Layout) -> Voiced:
        pieces: list[bytes] = []
        windows = frames = 0
        for segment in split_phonemes(self.g2p(text), self.engine.max_phonemes):
            if layout.schedule is None:
                timed = self.engine.infer_timed(segment, self.voice, 1.0, CancelToken())
                pieces.append(to_pcm16(self.trim.apply(timed.audio)))
                windows += 1
                frames += timed.audio.size // timed.frame_samples
                continue
            pcm, count, decoded = self._windows(segment, layout.schedule, layout.lead_s)
            pieces.append(pcm)
            windows += count
            frames += decoded
        return Voiced(b"".join(pieces), windows, frames)

    def _windows(self, segment: str, schedule: Schedule, lead_s: float) -> tuple[bytes, int, int]:
        front = self.engine.front(segment, self.voice, 1.0, CancelToken())
        speed = Speed(*schedule.design, front.frame_samples / SAMPLE_RATE)
        pause = int(front.durations[0]) if front.durations.size else 0
        windows = plan_windows(front.frames, schedule, speed, lead_s, pause)
        joiner = Joiner(front.frame_samples, schedule.crossfade)
        trim = StreamTrim(self.trim)
        out: list[FloatAudio] = []
        for window in windows:
            audio = self.engine.decode(front, window, CancelToken())
            out.append(trim.push(joiner.push(window, audio)))
        out.append(trim.flush())
        return to_pcm16(np.concatenate(out)), len(windows), sum(w.frames for w in windows)
