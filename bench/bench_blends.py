"""Voice blends against their one call, beside the voices they mix (docs/measured.md, "Voice
blends").

Runs the model server's own synthesis path in this process (Kokoro-82M int8 on onnxruntime,
espeak-ng G2P), each decoder in turn (`--decoders stream,windows`), over the quality corpus's
first `--replies` replies: each reply streamed as the server streams it (progressive) and in one
call per segment, by

- each voice of the blend alone;
- the blend (`--blend`), its prior made from its voices' as the server makes it;
- the blend with its voices' priors pooled as a mixture instead (the spread between the voices
  in each norm's variance): the rule the server does not use, for comparison (stream only);
- the same mix put among the loaded voices by hand, its prior calibrated over whole calls as a
  loaded voice's is: the oracle the blend's shortcut stands in for.

For each: the stream's level and spectrum against its one call (mean dB over the replies; the
progressive tests' measures, `quality/closeness.py`) and DistillMOS of both. Prints Markdown.

    .venv/bin/python -m bench.bench_blends [--blend "jf_alpha(1)+jm_kumo(1)"] [--replies 6]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from kokoro_contract import blends
from kokoro_contract.protocol import SynthesisRequest
from model_server.engines import streamed
from model_server.engines.onnx import OnnxEngine, OnnxOptions
from model_server.scheduler import Scheduler
from model_server.synthesis import Synthesizer
from model_server.text.g2p import english_g2p
from quality import closeness, corpus, judges

ORACLE = "zz_mixed_by_hand"


def mixture(parts: list[tuple[streamed.LengthPrior, float]]) -> streamed.LengthPrior:
    """The rule not taken: each norm's statistics pooled as a mixture of the voices'."""
    points = []
    for k in range(len(parts[0][0].points)):
        frames = sum(prior.points[k][0] * share for prior, share in parts)
        stats, weight = parts[0][0].points[k][1], parts[0][1]
        for prior, share in parts[1:]:
            other = prior.points[k][1]
            stats = {n: streamed.pooled(stats[n], weight, other[n], share) for n in stats}
            weight += share
        points.append((frames, stats))
    return streamed.LengthPrior(tuple(points))


@contextmanager
def rule(blended: Callable[..., streamed.LengthPrior]) -> Iterator[None]:
    kept = streamed.blended
    streamed.blended = blended
    try:
        yield
    finally:
        streamed.blended = kept


async def render(engine: OnnxEngine, text: str, voice: str, progressive: bool) -> np.ndarray:
    synthesizer = Synthesizer(engine, english_g2p(), Scheduler(1), progressive=progressive)
    try:
        request = SynthesisRequest(text, voice, 1.0, "bench")
        pcm = b"".join([chunk async for chunk in synthesizer.stream(request, "bench")])
    finally:
        synthesizer.close()
    return np.frombuffer(pcm, "<i2").astype(np.float32) / 32768


async def row(
    engine: OnnxEngine, judge: judges.MosJudge, voice: str, texts: list[str]
) -> tuple[float, float, float, float]:
    envelope, spectrum, whole_mos, stream_mos = [], [], [], []
    for text in texts:
        whole = await render(engine, text, voice, progressive=False)
        stream = await render(engine, text, voice, progressive=True)
        n = min(whole.size, stream.size)
        envelope.append(closeness.envelope_db(stream[:n], whole[:n]))
        spectrum.append(closeness.spectrum_difference_db(stream[:n], whole[:n]))
        whole_mos.append(closeness.mos(judge, whole))
        stream_mos.append(closeness.mos(judge, stream))
    return tuple(statistics.fmean(v) for v in (envelope, spectrum, whole_mos, stream_mos))  # type: ignore[return-value]


async def main(args: argparse.Namespace) -> None:
    blend = blends.parse_blend(args.blend)
    texts = [reply.text for reply in corpus.load()[: args.replies]]
    judge = judges.MosJudge()
    print(f"Blend {blend.name} over {len(texts)} replies of the quality corpus.\n")
    print("| decoder | voice | level dB | spectrum dB | MOS one call | MOS stream |")
    print("|---|---|---|---|---|---|")
    for decoder in args.decoders.split(","):
        engine = OnnxEngine(OnnxOptions(intra_op_threads=args.threads, decoder=decoder))
        packs = engine._packs  # the loaded packs and blends of them (private: a bench's look)
        packs._packs[ORACLE] = packs[blend.name]
        rows: list[tuple[str, Callable[..., streamed.LengthPrior] | None, str]] = [
            *((name, None, name) for name, _ in blend.parts),
            (blend.name, None, "blend, its voices' priors weighted (the server's)"),
        ]
        if decoder == "stream":
            rows.append((blend.name, mixture, "blend, its voices' priors pooled as a mixture"))
        rows.append((ORACLE, None, "the same mix loaded by hand, its own prior calibrated"))
        for voice, prior_rule, label in rows:
            with rule(prior_rule or streamed.blended):
                level, spectrum, whole, stream = await row(engine, judge, voice, texts)
            print(
                f"| {decoder} | {label} | {level:.2f} | {spectrum:.2f} | {whole:.2f} | "
                f"{stream:.2f} |",
                flush=True,
            )


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blend", default="jf_alpha(1)+jm_kumo(1)")
    parser.add_argument("--replies", type=int, default=6)
    parser.add_argument("--decoders", default="stream,windows")
    parser.add_argument("--threads", type=int, default=2)
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
