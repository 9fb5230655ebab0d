"""Word timings against the waveform: where the model server says each word is, next to where
the audio's energy says speech starts and stops (docs/measured.md, "Word timings").

Runs the model server's own synthesis path in this process (Kokoro-82M int8 on onnxruntime,
espeak-ng G2P, the default voice; `--voice` for another), one request per sentence with
`timestamps`, exactly as the WebSocket answers it: the audio sent (trimmed) and its word
timings. The energy side is independent of the timings: the level of every 5 ms of the audio
sent; a stretch of at least 30 ms more than 40 dB below the loudest 5 ms is quiet; an *onset*
is where a quiet stretch ends, an *offset* where one starts (the first and last samples count
as quiet before and after). For each word: its start next to the nearest onset, its end next to
the nearest offset, when one lies within 150 ms (in connected speech, words meet without a
quiet stretch between them, so many boundaries have none). Prints Markdown.

    .venv/bin/python -m bench.bench_timings [--voice jf_alpha] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from kokoro_contract.audio import SAMPLE_RATE
from kokoro_contract.protocol import SynthesisRequest, WordTiming, new_request_id

SENTENCES = (
    "Hello there.",
    "It costs $29.99, at 10:30 a.m. on Jan. 5th.",
    "Well, I think so. But then again, maybe not!",
    "Stop. Wait; listen: three, two, one.",
)
HOP = 120  # 5 ms
QUIET_DB = 40.0  # below the loudest 5 ms
MIN_QUIET_S = 0.03
NEAR_S = 0.15


@dataclass(frozen=True)
class Spoken:
    text: str
    pcm: bytes
    words: tuple[WordTiming, ...]


async def speak(texts: Sequence[str], voice: str | None, threads: int) -> list[Spoken]:
    from model_server.engines.onnx import OnnxEngine, OnnxOptions
    from model_server.scheduler import Scheduler
    from model_server.service import preferred_voice
    from model_server.synthesis import Synthesizer
    from model_server.text.g2p import english_g2p

    engine = OnnxEngine(OnnxOptions(intra_op_threads=threads))
    voice = voice or preferred_voice(frozenset(engine.voices()))
    synthesizer = Synthesizer(engine, english_g2p(), Scheduler(1))
    out = []
    try:
        for text in texts:
            request = SynthesisRequest(text, voice, 1.0, new_request_id(), timestamps=True)
            pcm = b""
            words: list[WordTiming] = []
            async for chunk in synthesizer.stream_timed(request, key="bench"):
                pcm += chunk.pcm
                words += chunk.words or ()
            out.append(Spoken(text, pcm, tuple(words)))
    finally:
        synthesizer.close()
    print(f"voice {voice}, engine {engine.description}\n")
    return out


def edges(pcm: bytes) -> tuple[list[float], list[float]]:
    """(onsets, offsets) in seconds: where the audio's quiet stretches end and start."""
    audio = np.frombuffer(pcm, "<i2").astype(np.float64) / 32768
    n = audio.size // HOP
    levels: npt.NDArray[np.float64] = 20 * np.log10(
        np.sqrt(np.mean(audio[: n * HOP].reshape(n, HOP) ** 2, axis=1)) + 1e-9
    )
    quiet = levels < levels.max() - QUIET_DB
    min_run = round(MIN_QUIET_S * SAMPLE_RATE / HOP)
    onsets, offsets = [], []
    i = 0
    while i < n:
        if not quiet[i]:
            i += 1
            continue
        j = i
        while j < n and quiet[j]:
            j += 1
        if j - i >= min_run or i == 0 or j == n:
            if i > 0:
                offsets.append(i * HOP / SAMPLE_RATE)
            if j < n:
                onsets.append(j * HOP / SAMPLE_RATE)
        i = j
    if not quiet[0]:
        onsets.insert(0, 0.0)
    if not quiet[-1]:
        offsets.append(n * HOP / SAMPLE_RATE)
    return onsets, offsets


def nearest(t: float, marks: Sequence[float]) -> float | None:
    best = min(marks, key=lambda m: abs(m - t), default=None)
    return best if best is not None and abs(best - t) <= NEAR_S else None


def cell(t: float, mark: float | None) -> str:
    """The energy's edge, and how many ms the word's time falls after it."""
    if mark is None:
        return "—"
    return f"{mark:.3f} ({1000 * (t - mark):+.0f})"


def report(spoken: Sequence[Spoken]) -> None:
    deltas: dict[str, list[float]] = {"start": [], "end": []}
    for one in spoken:
        onsets, offsets = edges(one.pcm)
        duration = len(one.pcm) / 2 / SAMPLE_RATE
        print(f"**{one.text}** ({duration:.3f} s sent)\n")
        print("| word | start s | nearest onset (ms after) | end s | nearest offset (ms after) |")
        print("| --- | ---: | ---: | ---: | ---: |")
        for w in one.words:
            onset, offset = nearest(w.start, onsets), nearest(w.end, offsets)
            if onset is not None:
                deltas["start"].append(1000 * (w.start - onset))
            if offset is not None:
                deltas["end"].append(1000 * (w.end - offset))
            print(
                f"| {w.word} | {w.start:.3f} | {cell(w.start, onset)} | {w.end:.3f} "
                f"| {cell(w.end, offset)} |"
            )
        print()
    print("| boundary | near an energy edge | median ms after it | median abs ms | max abs ms |")
    print("| --- | ---: | ---: | ---: | ---: |")
    words = sum(len(one.words) for one in spoken)
    for name, values in deltas.items():
        if not values:
            continue
        magnitudes = [abs(v) for v in values]
        print(
            f"| word {name} | {len(values)} of {words} | {statistics.median(values):+.0f} "
            f"| {statistics.median(magnitudes):.0f} | {max(magnitudes):.0f} |"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voice", default=None, help="default: the model server's default")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime threads")
    args = parser.parse_args(argv)
    report(asyncio.run(speak(SENTENCES, args.voice, args.threads)))


if __name__ == "__main__":
    main()
