"""`make bench-quality`: how the speech sounds, by voice, by format and bitrate, by chunk plan
and at joins, judged offline by DistillMOS (quality, 1-5) and PocketSphinx (word error rate).

The corpus is `quality/corpus.txt`: replies of varied English sentences (numbers, currency,
dates, times, abbreviations, questions, long clauses, lists), each with what a listener should
hear. Starts the real model server and gateway (separate processes, `make dev` defaults), then:

- voices: every voice pack the model server offers, each reply as one batch (`POST
  /invocations`), the whole corpus;
- formats: the default voice's batches encoded by the gateway's own encoders at the
  registry's settings and at other bitrates, decoded by FFmpeg, judged (the first
  `--format-replies` replies); each row's MOS beside the PCM of the same audio; the
  telephone's G.711 (`ulaw_8000`, `alaw_8000`) also beside the same PCM resampled to 8 kHz;
- chunk plans: the same replies as one batch, through the gateway's chunk plan with the whole
  text at once, and paced like an LLM (40 tokens/s, first token at 300 ms);
- joins: each sentence synthesized alone and the reply's sentences joined (judged per reply,
  beside the one batch), and 3-second windows of the paced gateway replies centred on the
  joins between chunks against windows centred inside chunks (MOS only: a window cuts words;
  short clips score lower, so windows are compared only with windows);
- progressive: each reply from model servers with `--progressive on`, one with each decoder
  (`--decoder stream`, the default, and `--decoder windows`; one binary frame per window on
  the WebSocket), beside one from a model server with `--progressive off` (one engine call
  per segment), the whole corpus: MOS and WER of each, and the seam detector
  (`quality/seams.py`: the largest step, the high-frequency energy and the level change at
  each seam, against the rest of the clip) at the windows decoder's seams, beside the same
  measures at the same points of the stream's and the one-call audio;
- stack: the path users get, end to end: each reply through the default gateway and model
  server (`make dev`'s settings, the SSE route, paced like an LLM), quiet, and again while a
  second conversation streams another reply through the same gateway, against one engine call
  per segment (a model server with `--progressive off`); every clip given the same silent
  margins (`MARGIN_S`) before the judges, as the served audio starts and ends closer to the
  speech than one call's; and quiet through a gateway whose first chunk is its first
  sentence whole (`--first-max-words` `WHOLE_FIRST_WORDS`) rather than cut at a phrase after
  a few words: what the cut costs the voice and saves the first audio (each gateway row
  prints its first audio's p50, from the request to the first audio event);
- layouts (not run by default): the decoder's window layouts at a fixed speed, in this
  process (`bench/window_layouts.py`): one call per segment, the default schedule as a
  reply's first segment, the same with wider context, and the largest windows; MOS, WER and
  the frames each decodes, the same on any machine.

MOS is the mean over clips weighted by their length; WER is corpus-level (errors / words).
Audio reaches the judges at 16 kHz through libswresample. `--write-baseline` stores the
default voice's corpus WER in `quality/baseline.json`, which the quality guard tests read.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import itertools
import multiprocessing
import os
import statistics
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import orjson

from bench.bench_gateway import FIRST_MS, TPS
from bench.bench_load import stack
from gateway.sources.sse import SSEDecoder
from kokoro_contract.formats import FORMATS
from quality import corpus, judges, seams
from quality.baseline import Baseline
from quality.wer import WordErrors, total, word_errors

WINDOW_S = 3.0
# silence around every clip of the stack section: PocketSphinx misreads a first word that
# starts within a few ms of its clip, and one call keeps more of its pauses than served audio
MARGIN_S = 0.5
# the stack section's first chunk kept whole: a first sentence of the corpus is never longer
WHOLE_FIRST_WORDS = 60
# (format, kbit/s) judged beside the registry's own setting of each codec
BITRATES: dict[str, tuple[int, ...]] = {
    "mp3": (32, 40, 48, 64, 96),
    "aac": (32, 40, 48, 64, 96),
    "opus": (16, 24, 32, 48),
}


@dataclass(frozen=True)
class Clip:
    samples: judges.Samples  # 16 kHz
    spoken: str | None  # None: judge quality only


@dataclass(frozen=True)
class Score:
    mos: float
    errors: WordErrors | None
    seconds: float
    clips: tuple[float, ...] = ()  # each clip's MOS, in the order judged

    @property
    def wer(self) -> str:
        return f"{self.errors.rate:5.3f}" if self.errors is not None else "    -"


# --- judging in two worker processes (PocketSphinx is single-threaded) -------------------------

_mos: judges.MosJudge | None = None
_asr: judges.AsrJudge | None = None


def _init_worker() -> None:
    import torch

    global _mos, _asr
    torch.set_num_threads(1)
    _mos, _asr = judges.MosJudge(), judges.AsrJudge()


def _judge_one(clip: Clip) -> tuple[float, WordErrors | None]:
    assert _mos is not None
    assert _asr is not None
    mos = _mos.score(clip.samples)
    if clip.spoken is None:
        return mos, None
    return mos, word_errors(clip.spoken, _asr.transcribe(clip.samples))


class Judges:
    def __init__(self, workers: int) -> None:
        # spawned, not forked: the parent's FFmpeg and HTTP threads do not survive a fork
        spawn = multiprocessing.get_context("spawn")
        self._pool = ProcessPoolExecutor(workers, mp_context=spawn, initializer=_init_worker)

    def judge(self, clips: Sequence[Clip]) -> Score:
        results = list(self._pool.map(_judge_one, clips))
        seconds = [len(c.samples) / judges.JUDGE_RATE for c in clips]
        mos = float(np.average([m for m, _ in results], weights=seconds))
        counted = [e for _, e in results if e is not None]
        clip_mos = tuple(m for m, _ in results)
        return Score(mos, total(counted) if counted else None, sum(seconds), clip_mos)

    def close(self) -> None:
        self._pool.shutdown()


# --- audio from the services -------------------------------------------------------------------


def batch(http: httpx.Client, text: str, voice: str) -> bytes:
    """One `POST /invocations` of the whole text: s16le PCM."""
    response = http.post("/invocations", json={"text": text, "voice": voice, "format": "pcm"})
    response.raise_for_status()
    return response.content


@dataclass(frozen=True)
class GatewayReply:
    pcm: bytes
    chunk_audio_s: list[float]
    first_s: float  # from the request to its first audio event


async def gateway_reply(base: str, text: str, voice: str, paced: bool) -> GatewayReply:
    body: dict[str, object] = {"text": text, "voice": voice, "format": "pcm", "mode": "bidi"}
    if paced:
        body |= {"echo_tps": TPS, "echo_first_ms": FIRST_MS}
    pcm = bytearray()
    metrics: dict[str, object] = {}
    first_s: float | None = None
    started = time.perf_counter()
    async with (
        httpx.AsyncClient(base_url=base, timeout=300) as http,
        http.stream("POST", "/v1/speak", json=body) as response,
    ):
        response.raise_for_status()
        decoder = SSEDecoder()
        async for raw in response.aiter_raw():
            for event in decoder.push(raw):
                data = orjson.loads(event.data)
                if event.event == "audio_chunk":
                    if first_s is None:
                        first_s = time.perf_counter() - started
                    pcm += base64.b64decode(data["data"])
                elif event.event == "error":
                    raise RuntimeError(f"gateway error: {data}")
                elif event.event == "agent_end":
                    metrics = data["metrics"]
    chunks = metrics.get("chunk_audio_s")
    assert isinstance(chunks, list)
    assert first_s is not None
    return GatewayReply(bytes(pcm), [float(c) for c in chunks], first_s)


def windows(samples: judges.Samples, chunk_audio_s: list[float]) -> tuple[list[Clip], list[Clip]]:
    """3-second windows centred on each join between chunks, and centred inside each chunk
    long enough to hold one (the same length: DistillMOS pads short clips alike)."""
    half = int(WINDOW_S / 2 * judges.JUDGE_RATE)
    edges = np.cumsum([0.0, *chunk_audio_s]) * judges.JUDGE_RATE
    joins, inside = [], []
    for start, end in itertools.pairwise(edges):
        if start > 0 and int(start) - half >= 0 and int(start) + half <= len(samples):
            joins.append(Clip(samples[int(start) - half : int(start) + half], None))
        if end - start >= WINDOW_S * judges.JUDGE_RATE:
            middle = int((start + end) / 2)
            inside.append(Clip(samples[middle - half : middle + half], None))
    return joins, inside


# --- the run -----------------------------------------------------------------------------------


def pcm_clip(pcm: bytes, spoken: str | None) -> Clip:
    return Clip(judges.decode(pcm, "pcm"), spoken)


def run(args: argparse.Namespace) -> dict[str, list[tuple[str, Score]]]:
    replies = corpus.load()[: args.replies or None]
    judge = Judges(args.judges)
    tables: dict[str, list[tuple[str, Score]]] = {}
    try:
        with stack([], []) as urls, httpx.Client(base_url=urls.model_server, timeout=600) as http:
            listed = http.get("/voices").json()
            default = listed["default"]
            voices = [v["name"] for v in listed["voices"]]
            if args.voices:
                voices = [v for v in args.voices.split(",") if v in voices]
            if "voice" not in args.sections:
                voices = []

            started = time.perf_counter()
            batches: dict[str, list[bytes]] = {}
            if voices:
                tables["voice"] = []
            for voice in voices:
                batches[voice] = [batch(http, r.text, voice) for r in replies]
                score = judge.judge(
                    [pcm_clip(p, r.spoken) for p, r in zip(batches[voice], replies, strict=True)]
                )
                mark = " (default)" if voice == default else ""
                tables["voice"].append((voice + mark, score))
                print(f"  voice {voice + mark:<24} {describe(score)}", flush=True)
            if default not in batches and {"format", "plan"} & set(args.sections.split(",")):
                batches[default] = [batch(http, r.text, default) for r in replies]
            print(f"  [voices: {time.perf_counter() - started:.0f} s]", flush=True)
            if "progressive" in args.sections:
                tables["progressive"], seam_rows = progressive_tables(judge, default, replies)
                tables["progressive seams"] = seam_rows

            if "stack" in args.sections:
                tables["stack"] = stack_table(judge, urls.gateway, default, replies)
            if "layouts" in args.sections:
                tables["window layouts"] = layout_table(judge, default, replies)
            if "format" in args.sections:
                pcms = batches[default][: args.format_replies]
                tables["format"] = format_table(judge, pcms, replies, args.telephone_only)
            if "plan" in args.sections:
                tables["chunk plan"], tables["joins"] = plan_tables(
                    judge, http, urls.gateway, default, replies, batches[default]
                )
            if args.write_baseline:
                voice_score = dict(tables.get("voice", []))[default + " (default)"]
                assert voice_score.errors is not None
                Baseline(default, voice_score.errors.errors, voice_score.errors.words).write()
                print(f"  baseline written: {default} WER {voice_score.errors.rate:.3f}")
    finally:
        judge.close()
    return tables


def format_table(
    judge: Judges, pcms: list[bytes], replies: list[corpus.Reply], telephone_only: bool = False
) -> list[tuple[str, Score]]:
    """Each format's round trip beside pcm; `telephone_only`: pcm, pcm at 8 kHz and G.711."""
    started = time.perf_counter()
    spoken = [r.spoken for r in replies[: len(pcms)]]
    rows: list[tuple[str, Score]] = []

    def row(label: str, samples: list[judges.Samples]) -> None:
        score = judge.judge([Clip(s, t) for s, t in zip(samples, spoken, strict=True)])
        rows.append((label, score))
        print(f"  format {label:<28} {describe(score)}{spread(score)}", flush=True)

    def spread(score: Score) -> str:
        """Against pcm reply by reply: the least and most each reply's MOS moved."""
        if not rows or score is rows[0][1]:
            return ""
        pcm = rows[0][1].clips
        moved = [a - b for a, b in zip(score.clips, pcm, strict=True)]
        mean = score.mos - rows[0][1].mos
        return f"  vs pcm {mean:+.2f}, by reply [{min(moved):+.2f}, {max(moved):+.2f}]"

    row("pcm", [judges.decode(p, "pcm") for p in pcms])
    for name in () if telephone_only else ("flac", "mp3", "aac", "opus"):
        fmt = FORMATS[name]
        settings = [fmt.bit_rate // 1000] if fmt.bit_rate else []
        for kbps in sorted({*BITRATES.get(name, ()), *settings}):
            variant = dataclasses.replace(fmt, bit_rate=kbps * 1000)
            mark = " (registry)" if kbps in settings else ""
            row(f"{name} {kbps} kbit/s{mark}", [judges.round_trip(p, variant) for p in pcms])
        if not settings:
            row(name, [judges.round_trip(p, fmt) for p in pcms])
    # the telephone's: G.711 against the same voice resampled to 8 kHz (what its band allows)
    row("pcm at 8 kHz", [judges.round_trip(p, FORMATS["pcm"].at(8_000)) for p in pcms])
    for name in ("ulaw_8000", "alaw_8000"):
        row(name, [judges.round_trip(p, FORMATS[name]) for p in pcms])
    aac = FORMATS["aac"]  # FFmpeg's default coder, for the record
    if aac.codec_options and not telephone_only:
        variant = dataclasses.replace(aac, codec_options={})
        kbps = (aac.bit_rate or 0) // 1000
        row(f"aac {kbps} kbit/s, twoloop", [judges.round_trip(p, variant) for p in pcms])
    print(f"  [formats: {time.perf_counter() - started:.0f} s]", flush=True)
    return rows


def plan_tables(
    judge: Judges,
    http: httpx.Client,
    gateway: str,
    voice: str,
    replies: list[corpus.Reply],
    batches: list[bytes],
) -> tuple[list[tuple[str, Score]], list[tuple[str, Score]]]:
    started = time.perf_counter()
    plans: list[tuple[str, Score]] = []
    pairs = zip(batches, replies, strict=True)
    plans.append(("one batch", judge.judge([pcm_clip(p, r.spoken) for p, r in pairs])))
    paced_replies: list[GatewayReply] = []
    for label, paced in (("gateway, text at once", False), ("gateway, paced like an LLM", True)):
        got = [asyncio.run(gateway_reply(gateway, r.text, voice, paced)) for r in replies]
        if paced:
            paced_replies = got
        chunks = sum(len(g.chunk_audio_s) for g in got)
        score = judge.judge([pcm_clip(g.pcm, r.spoken) for g, r in zip(got, replies, strict=True)])
        plans.append((f"{label} ({chunks} chunks)", score))
    for label, score in plans:
        print(f"  plan {label:<34} {describe(score)}", flush=True)

    joins: list[tuple[str, Score]] = []
    alone = [
        pcm_clip(b"".join(batch(http, s.text, voice) for s in r.sentences), r.spoken)
        for r in replies
    ]  # judged per reply, like the batches: DistillMOS scores short clips lower
    sentences = sum(len(r.sentences) for r in replies)
    joins.append((f"sentences synthesized alone, joined ({sentences})", judge.judge(alone)))
    at_joins: list[Clip] = []
    inside: list[Clip] = []
    for reply in paced_replies:
        j, i = windows(pcm_clip(reply.pcm, None).samples, reply.chunk_audio_s)
        at_joins += j
        inside += i
    for where, clips in (("on joins", at_joins), ("in chunks", inside)):
        if clips:
            joins.append((f"{WINDOW_S:.0f} s windows {where} ({len(clips)})", judge.judge(clips)))
    for label, score in joins:
        print(f"  joins {label:<33} {describe(score)}", flush=True)
    print(f"  [plans and joins: {time.perf_counter() - started:.0f} s]", flush=True)
    return plans, joins


async def ws_reply(url: str, text: str, voice: str) -> tuple[bytes, list[int]]:
    """One reply over the bidirectional WebSocket: its PCM and its binary frames' sizes."""
    from websockets.asyncio.client import connect

    ws_url = url.replace("http://", "ws://") + "/invocations-bidirectional-stream"
    frames: list[bytes] = []
    async with connect(ws_url, max_size=None) as ws:
        await ws.send(orjson.dumps({"text": text, "voice": voice, "request_id": "q"}))
        async for frame in ws:
            if isinstance(frame, bytes):
                frames.append(frame)
                continue
            event = orjson.loads(frame)
            if event["type"] == "synthesis_complete":
                return b"".join(frames), [len(f) for f in frames]
            if event["type"] == "error":
                raise RuntimeError(f"model server error: {event}")
    raise RuntimeError("the model server closed early")


def margined(pcm: bytes, spoken: str) -> Clip:
    """A PCM clip with `MARGIN_S` of silence on each side."""
    samples = judges.decode(pcm, "pcm")
    pad = np.zeros(int(MARGIN_S * judges.JUDGE_RATE), samples.dtype)
    return Clip(np.concatenate([pad, samples, pad]), spoken)


def stack_table(
    judge: Judges, gateway: str, voice: str, replies: list[corpus.Reply]
) -> list[tuple[str, Score]]:
    """The default stack end to end, quiet and with a second conversation beside it, against
    one call per segment (the module's docstring)."""
    started = time.perf_counter()

    refused = {"second": 0, "judged": 0}  # replies the gateway's admission refused (503)

    async def busy(reply: corpus.Reply, other: corpus.Reply) -> GatewayReply:
        """`reply` while `other` streams: the other conversation starts first; a refused reply
        (the machine has room for one at a time) is asked again, and counted."""
        second = asyncio.create_task(gateway_reply(gateway, other.text, voice, True))
        await asyncio.sleep(0.3)  # its first chunk has gone to the model server
        while True:
            try:
                mine = await gateway_reply(gateway, reply.text, voice, True)
                break
            except httpx.HTTPStatusError as exc:
                if exc.response.status_code != 503:
                    raise
                refused["judged"] += 1
                await asyncio.sleep(0.5)
        try:
            await second
        except httpx.HTTPStatusError:
            refused["second"] += 1
        return mine

    with (
        stack(["--progressive", "off"], []) as off,
        httpx.Client(base_url=off.model_server, timeout=600) as whole_http,
    ):
        whole = [batch(whole_http, r.text, voice) for r in replies]
    # the first chunk cut at a phrase after a few words (the default) against the first
    # sentence whole: what the cut costs the voice, and what it saves the first audio
    with stack([], ["--first-max-words", str(WHOLE_FIRST_WORDS)]) as whole_first:
        kept = [
            asyncio.run(gateway_reply(whole_first.gateway, r.text, voice, True)) for r in replies
        ]
    quiet = [asyncio.run(gateway_reply(gateway, r.text, voice, True)) for r in replies]
    beside = [asyncio.run(busy(r, replies[(k + 1) % len(replies)])) for k, r in enumerate(replies)]

    def first(got: list[GatewayReply]) -> str:
        return f"first audio p50 {statistics.median(g.first_s for g in got):.2f} s"

    rows = [
        ("one call per segment (--progressive off)", whole),
        (f"the default stack, quiet ({first(quiet)})", [g.pcm for g in quiet]),
        (
            f"the stack, first sentence whole, quiet ({first(kept)})",
            [g.pcm for g in kept],
        ),
        (
            f"the default stack, a second conversation beside it ({first(beside)})",
            [g.pcm for g in beside],
        ),
    ]
    scored = [
        (label, judge.judge([margined(p, r.spoken) for p, r in zip(pcms, replies, strict=True)]))
        for label, pcms in rows
    ]
    for label, score in scored:
        print(f"  stack {label:<52} {describe(score)}", flush=True)
    print(
        f"  [stack: {time.perf_counter() - started:.0f} s; refused while busy: the judged "
        f"reply {refused['judged']} times, the second conversation {refused['second']} times]",
        flush=True,
    )
    return scored


def progressive_tables(
    judge: Judges, voice: str, replies: list[corpus.Reply]
) -> tuple[list[tuple[str, Score]], list[tuple[str, Score]]]:
    """Progressive against one call per segment, and the seam measures (as Scores: `mos`
    holds the measure, for the tables; no WER)."""
    started = time.perf_counter()
    rows: list[tuple[str, Score]] = []
    progressive: list[tuple[bytes, list[int]]] = []
    crossfaded: list[tuple[bytes, list[int]]] = []
    whole: list[bytes] = []
    with (
        stack(["--progressive", "off"], []) as off,
        stack(["--progressive", "on", "--decoder", "stream"], []) as on,
        stack(["--progressive", "on", "--decoder", "windows"], []) as by_windows,
        httpx.Client(base_url=off.model_server, timeout=600) as whole_http,
    ):
        for reply in replies:
            whole.append(batch(whole_http, reply.text, voice))
            progressive.append(asyncio.run(ws_reply(on.model_server, reply.text, voice)))
            crossfaded.append(asyncio.run(ws_reply(by_windows.model_server, reply.text, voice)))
    one_call = [pcm_clip(p, r.spoken) for p, r in zip(whole, replies, strict=True)]
    rows.append(("one call per segment (--progressive off)", judge.judge(one_call)))
    pairs = (("--decoder stream (default)", progressive), ("--decoder windows", crossfaded))
    for label, got in pairs:
        clips = [pcm_clip(p, r.spoken) for (p, _), r in zip(got, replies, strict=True)]
        rows.append((f"{label} ({sum(len(s) for _, s in got)} windows)", judge.judge(clips)))
    # the gateway's lossy formats at their registry settings, on both: a seam the PCM judge
    # does not mind could still be smeared by a codec
    for name in ("mp3", "aac"):
        fmt = FORMATS[name]
        for label, pcms in (("one call", whole), ("stream", [p for p, _ in progressive])):
            clips = [
                Clip(judges.round_trip(p, fmt), r.spoken)
                for p, r in zip(pcms, replies, strict=True)
            ]
            rows.append(
                (f"{label}, {name} {(fmt.bit_rate or 0) // 1000} kbit/s", judge.judge(clips))
            )
    for label, score in rows:
        print(f"  progressive {label:<40} {describe(score)}", flush=True)

    measures: dict[str, list[float]] = {}
    for (pcm, _), (windowed, sizes), reference in zip(progressive, crossfaded, whole, strict=True):
        # the windows decoder's seams, and the stream's audio and one call's at those points
        at = [int(a) for a in np.cumsum([s // 2 for s in sizes])[:-1]]
        for label, audio in (("windows", windowed), ("stream", pcm), ("one call", reference)):
            samples = judges.pcm16(audio)
            points = [a for a in at if 0 < a < samples.size - 1]
            if not points:
                continue
            report = seams.seams(samples, points)
            for seam in report.seams:
                measures.setdefault(f"{label}: step", []).append(seam.jump)
                measures.setdefault(f"{label}: HF", []).append(seam.hf)
                measures.setdefault(f"{label}: level", []).append(seam.level_db)
    seam_rows: list[tuple[str, Score]] = []
    for label, values in measures.items():
        for stat, value in (("worst", max(values)), ("p95", float(np.quantile(values, 0.95)))):
            seam_rows.append((f"{label}, {stat} of {len(values)}", Score(value, None, 0.0)))
    for label, score in seam_rows:
        print(f"  seams {label:<40} {score.mos:5.2f}", flush=True)
    print(f"  [progressive: {time.perf_counter() - started:.0f} s]", flush=True)
    return rows, seam_rows


def layout_table(judge: Judges, voice: str, replies: list[corpus.Reply]) -> list[tuple[str, Score]]:
    """Each of `window_layouts.LAYOUTS` over the replies, judged; the label says its windows
    and the decoder's frames against one call's."""
    from bench.window_layouts import LAYOUTS, LayoutSynth

    started = time.perf_counter()
    synth = LayoutSynth(voice)
    rows: list[tuple[str, Score]] = []
    one_call = 0
    for layout in LAYOUTS:
        voiced = [synth.reply(r.text, layout) for r in replies]
        frames = sum(v.frames for v in voiced)
        one_call = one_call or frames  # the first layout is one call per segment
        score = judge.judge(
            [pcm_clip(v.pcm, r.spoken) for v, r in zip(voiced, replies, strict=True)]
        )
        label = (
            f"{layout.label}: {sum(v.windows for v in voiced)} windows, "
            f"frames {frames / one_call:.2f}x"
        )
        rows.append((label, score))
        print(f"  layouts {label:<72} {describe(score)}", flush=True)
    print(f"  [layouts: {time.perf_counter() - started:.0f} s]", flush=True)
    return rows


def describe(score: Score) -> str:
    return f"MOS {score.mos:4.2f}  WER {score.wer}  ({score.seconds:5.1f} s of audio)"


def plot(tables: dict[str, list[tuple[str, Score]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 5))
    for ax, (name, rows) in zip(np.atleast_1d(axes), tables.items(), strict=True):
        labels = [label for label, _ in rows]
        y = np.arange(len(rows))
        ax.barh(y - 0.2, [s.mos for _, s in rows], height=0.4, label="MOS (1-5)")
        wer = [s.errors.rate * 5 if s.errors is not None else 0 for _, s in rows]
        ax.barh(y + 0.2, wer, height=0.4, label="WER x 5")
        ax.set_yticks(y, labels, fontsize=7)
        ax.invert_yaxis()
        ax.set(xlim=(0, 5), title=f"by {name}")
        ax.grid(axis="x", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replies", type=int, default=0, help="corpus replies (0: all)")
    parser.add_argument("--format-replies", type=int, default=3)
    parser.add_argument(
        "--telephone-only", action="store_true", help="format: pcm, pcm at 8 kHz and G.711 only"
    )
    parser.add_argument("--voices", default="", help="comma-separated (default: all offered)")
    parser.add_argument("--judges", type=int, default=os.cpu_count() or 1, help="processes")
    parser.add_argument(
        "--sections",
        default="voice,format,plan,stack,progressive",
        help="which tables (plan: chunk plans, joins; stack: the default stack end to end, "
        "quiet and busy, against one call; progressive: the decoders against one call; "
        "layouts: window layouts at a fixed speed, not run by default)",
    )
    parser.add_argument(
        "--write-baseline", action="store_true", help="store the default voice's corpus WER"
    )
    parser.add_argument("--plot", type=Path, default=Path("docs/bench-quality.png"))
    args = parser.parse_args()
    started = time.perf_counter()
    tables = run(args)
    replies = corpus.load()[: args.replies or None]
    print(
        f"\nbench-quality: {len(corpus.sentences(replies))} sentences in {len(replies)} replies; "
        f"DistillMOS (1-5, higher is better), PocketSphinx WER (lower is better); "
        f"{time.perf_counter() - started:.0f} s"
    )
    for name, rows in tables.items():
        print(f"\n| {name} | MOS | WER | audio s |\n|---|---:|---:|---:|")
        for label, score in rows:
            print(f"| {label} | {score.mos:.2f} | {score.wer.strip()} | {score.seconds:.0f} |")
    plot(tables, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
