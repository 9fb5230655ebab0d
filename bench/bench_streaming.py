"""The streaming decoder with the registry's real weights (issue 47): what its norms cost.

Kokoro's torch `Decoder` gets the registry int8 graph's decoder weights, dequantized
(`model_server.engines.registry_decoder`); the decoder's inputs come from the project's split
front graph on real sentences (jm_kumo). First the torch decoder against the graph's float twin
(the same graph, its quantized operators made float) and against the int8 graph itself, then
`StreamingDecoder` at 16 frames a push against the torch decoder's whole call, under each
rule for the norms' statistics:

- oracle: the whole call's own (exact by construction);
- two-pass: the body's from a whole-segment body pass, the generator's from that output run
  through the generator in whole (exact too, by construction: it is the whole call again);
- body exact + first window (16 frames, or 80): the body's exact, the generator's from the
  generator over the first frames alone (a whole call of the generator on them);
- body exact + voice prior: the body's exact, the generator's the voice's over the reference
  text (`carried_norms.CALIBRATION_PHONEMES`, as the onnx engine's prior is);
- body exact + prior and first window: the generator's the prior weighing `PRIOR_FRAMES`
  blended with the first window's (as `carried_norms` blends a window into the prior);
- voice prior: every norm's the voice's prior (nothing from the segment);
- body exact + generator carried: the generator's statistics set before each push, the
  voice's prior pooled with what each of its norms has seen so far (`Carried`: causal, a frame
  streamed keeps the statistics it was normalised by), the prior weighing as many frames as the
  norm has still to see, at most `PRIOR_FRAMES` (`carried_norms`' rule), or `PRIOR_FRAMES` less
  the frames seen (fading); or counting the input each norm is normalising too, as a window's
  own frames count in `carried_norms` (set by the decoder's observer, before it normalises);
- the oracle but the voice's prior for one group of the generator's norms (which matter).

Each: SNR against the whole call, and the per-frame (25 ms) level error in dB over the frames
within 40 dB of the loudest; `--judges` adds DistillMOS and PocketSphinx's word errors.

    .venv/bin/python -m bench.bench_streaming [--threads 2] [--judges]
    .venv/bin/python -m bench.bench_streaming --corpus prior,oracle,carried,onecall
"""

from __future__ import annotations

import argparse
import contextlib
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from model_server.engines import weights
from model_server.engines.base import style_row, tokenize
from model_server.engines.carried_norms import CALIBRATION_PHONEMES, PRIOR_FRAMES
from model_server.engines.registry_decoder import GRAPH_GAIN
from model_server.engines.voices import load_packaged

SAMPLES_PER_FRAME = 600
VOICE = "jm_kumo"
PUSH = 16  # frames a push
# the harmonic source's STFT in the graph (magnitude and phase, [1, 22, steps]): where the
# source is constant (unvoiced: the graph draws no noise) its bins but DC are rounding noise,
# and their phase, which the noise branch reads, is whatever the FFT's rounding gives
SPECTRUM = "/decoder/decoder/generator/Concat_3_output_0"
# conv_post's output (log-magnitude and phase before the iSTFT, [1, 22, steps]): from here the
# graph's iSTFT (a transposed convolution over a fixed basis, x4, its first 20 samples divided
# by the window's squares, 10 cut at each end) is not torch.istft
POST = "/decoder/decoder/generator/conv_post/Conv_output_0"
# literal phonemes (espeak's), none of the prior's reference text
SENTENCES = {
    "hello": "həlˈO ðˈɛɹ.",
    "fox": "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ nˌɪɹ ðə ɹˈɪvəɹ bˈæŋk.",
    "order": "jʊɹ ˈɔɹdəɹ ʃˈɪpt jˈɛstəɹdˌA fɹʌm ˌWəɹ wˈɛɹhˌWs ɪn pˈɔɹtlənd.",
    "clinic": (
        "plˈiz bɹˈɪŋ jʊɹ ɪnʃˈʊɹəns kˈɑɹd, ɐ fˈOɾO ˌIdˈi, ænd ɐ lˈɪst ʌv jʊɹ kˈɜɹənt mˌɛdəkˈAʃənz."
    ),
}
# what a listener should hear (the judges' reference)
WORDS = {
    "hello": "hello there",
    "fox": "the quick brown fox jumps over the lazy dog near the river bank",
    "order": "your order shipped yesterday from our warehouse in portland",
    "clinic": "please bring your insurance card a photo i d and a list of your current medications",
}


@dataclass(frozen=True)
class Real:
    """The registry's model, as the bench and tests/model_server/engines/test_registry_decoder.py
    use it: the split front graph's session, the int8 graph's decoder and its float twin
    (sessions), the torch decoder with the graph's weights, the vocab and voice packs."""

    front: Any
    int8: Any
    twin: Any
    tail: Any  # the graph's iSTFT: POST -> audio
    decoder: Any
    vocab: dict[str, int]
    packs: dict[str, Any]

    def inputs(self, phonemes: str, voice: str = VOICE) -> dict[str, Any]:
        """The decoder's inputs for `phonemes` at speed 1, by the graph's tensor names."""
        tokens = tokenize(phonemes, self.vocab, 510)
        pack = self.packs[voice]
        feed = {
            "tokens": np.array([[0, *tokens, 0]], np.int64),
            "style": pack[style_row(len(tokens), len(pack))].reshape(1, -1).astype(np.float32),
            "speed": np.array([1.0], np.float32),
        }
        wanted = [i.name for i in self.front.get_inputs()]
        out = self.front.run(list(weights.DECODER_INPUTS), {k: feed[k] for k in wanted})
        return dict(zip(weights.DECODER_INPUTS, out, strict=True))

    def graph_audio(self, session: Any, inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
        """A decoder graph's audio (samples,), its source's STFT (`SPECTRUM`) and conv_post's
        output (`POST`)."""
        names = {i.name for i in session.get_inputs()}
        audio, spectrum, post = session.run(
            ["audio", SPECTRUM, POST], {k: v for k, v in inputs.items() if k in names}
        )
        return np.asarray(audio).ravel(), spectrum, post

    def graph_istft(self, post: Any) -> Any:
        """The graph's own iSTFT of conv_post's output `post`: audio (samples,)."""
        return np.asarray(self.tail.run(["audio"], {POST: np.asarray(post)})[0]).ravel()


def load(threads: int = 2) -> Real:
    import onnx
    import onnxruntime as ort
    from onnx.utils import Extractor

    from model_server.engines.registry_decoder import float_twin, registry_decoder

    cache = weights.default_cache_dir()
    model_path = weights.assemble_model(cache)
    front_path = weights.split_models(weights.timed_model(model_path, cache), cache)[0]
    model = onnx.load(str(model_path))
    decoder_graph = Extractor(model).extract_model(
        list(weights.DECODER_INPUTS), ["audio", SPECTRUM, POST]
    )
    twin = float_twin(decoder_graph)
    tail = Extractor(decoder_graph).extract_model([POST], ["audio"])

    def session(source: Any) -> Any:
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])

    packs = load_packaged(weights.packaged_voices_file().read_bytes())
    return Real(
        session(str(front_path)),
        session(decoder_graph.SerializeToString()),
        session(twin.SerializeToString()),
        session(tail.SerializeToString()),
        registry_decoder(model),
        weights.load_vocab(),
        packs,
    )


@contextmanager
def given_source(decoder: Any, harmonics: Any) -> Iterator[None]:
    """Inside this block `decoder`'s harmonic source is `harmonics` (the front graph's: the
    registry graph draws no random phase or noise), not one drawn by torch."""
    hook = decoder.generator.m_source.register_forward_hook(
        lambda _m, _i, out: (harmonics, *out[1:])
    )
    try:
        yield
    finally:
        hook.remove()


@contextmanager
def given_spectrum(decoder: Any, spectrum: Any) -> Iterator[None]:
    """Inside this block `decoder`'s STFT of the harmonic source answers `spectrum` (a graph's
    `SPECTRUM`: magnitude and phase), not torch's."""
    import torch

    stft = decoder.generator.stft
    bins = spectrum.shape[1] // 2
    given = torch.from_numpy(np.asarray(spectrum))
    stft.transform = lambda _x: (given[:, :bins], given[:, bins:])
    try:
        yield
    finally:
        del stft.transform


@dataclass(frozen=True)
class Segment:
    """The torch decoder's inputs for a segment and its whole call (audio, statistics)."""

    asr: Any
    f0: Any
    n: Any
    style: Any
    harmonics: Any  # (1, samples)
    audio: Any  # (samples,) float32
    statistics: dict[str, Any]
    post: Any  # conv_post's output (1, 22, steps)

    @property
    def frames(self) -> int:
        return int(self.asr.shape[-1])


def whole_call(real: Real, inputs: dict[str, Any], spectrum: Any = None) -> Segment:
    """The torch decoder's whole call over `inputs` (the graph's harmonic source; its STFT
    torch's, or `spectrum` when given)."""
    import torch

    from model_server.engines.streaming_decoder import recording_statistics

    asr, f0, n, style, har = (
        torch.from_numpy(np.asarray(inputs[k])) for k in weights.DECODER_INPUTS
    )
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode())
        stack.enter_context(given_source(real.decoder, har))
        if spectrum is not None:
            stack.enter_context(given_spectrum(real.decoder, spectrum))
        statistics = stack.enter_context(recording_statistics(real.decoder))
        posts: list[Any] = []
        hook = real.decoder.generator.conv_post.register_forward_hook(
            lambda _m, _i, out: posts.append(out)
        )
        stack.callback(hook.remove)
        audio = real.decoder(asr, f0, n, style)
    return Segment(
        asr, f0, n, style, har.reshape(1, -1), audio.numpy().ravel(), statistics, posts[0].numpy()
    )


class Carried:
    """The generator's statistics carried as the segment streams, as `carried_norms` carries
    them from window to window: before each push, each generator norm's are the voice's prior
    pooled with the statistics of the inputs that norm has seen so far (the frames already
    streamed; they cannot be normalised again), the prior weighing `weight(seen, frames)`
    frames (`seen` the frames the norm has seen, at its rate, of the segment's `frames`); the
    body's are given (`body`: exact, from a whole-segment body pass; with `group`, only the
    norms whose names start with it are carried, `body` gives the rest). `own`: each norm's
    statistics also count the input it is normalising (set as the decoder's observer tells
    it, before it normalises), as a window's own frames count in `carried_norms`."""

    def __init__(
        self,
        decoder: Any,
        body: dict[str, Any],
        prior: dict[str, Any],
        frames: int,
        weight: Callable[[float, float], float],
        own: bool = False,
        group: str = "generator.",
    ) -> None:
        self.body, self.frames, self.weight = body, frames, weight
        self.prior = {k: v for k, v in prior.items() if k.startswith(group)}
        gen = decoder.generator
        rates, rate = [], 2.0  # the generator's input: 2 steps a frame
        for ups in gen.ups:
            rate *= int(ups.stride[0])
            rates.append(rate)
        self.rates: dict[str, float] = {}
        for name in self.prior:
            _, group, index, *_ = name.split(".")
            stage = int(index) if group == "noise_res" else int(index) // gen.num_kernels
            self.rates[name] = rates[stage]
        self.own = own
        self.target: Any = None  # the StreamingDecoder, for `own`
        self.current: dict[str, Any] = {}
        self.sums: dict[str, Any] = {}
        self.squares: dict[str, Any] = {}
        self.steps: dict[str, int] = {}

    def observe(self, name: str, x: Any) -> None:
        if name not in self.prior or x.shape[-1] == 0:
            return
        x = x.double()
        self.sums[name] = self.sums.get(name, 0) + x.sum(-1, keepdim=True)
        self.squares[name] = self.squares.get(name, 0) + (x * x).sum(-1, keepdim=True)
        self.steps[name] = self.steps.get(name, 0) + x.shape[-1]
        if self.own:  # this input is normalised by statistics that count it
            self.current[name] = self._norm(name)
            self.target.set_statistics(self.current)

    def _norm(self, name: str) -> tuple[Any, Any]:
        prior, steps = self.prior[name], self.steps.get(name, 0)
        seen = steps / self.rates[name]
        weight = self.weight(seen, self.frames)
        if steps == 0:
            return prior  # type: ignore[no-any-return]
        mean = self.sums[name] / steps
        own = (mean, self.squares[name] / steps - mean**2)
        return own if weight <= 0 else _blend(prior, weight, own, seen)

    def statistics(self) -> dict[str, Any]:
        self.current = self.body | {name: self._norm(name) for name in self.prior}
        return self.current


def stream(
    real: Real, segment: Segment, statistics: dict[str, Any] | Carried, push: int = PUSH
) -> Any:
    """`segment` streamed `push` frames at a time by `statistics`: fixed, or `Carried` (set
    before each push)."""
    import torch

    from model_server.engines.streaming_decoder import StreamingDecoder

    carried: Carried | None = None
    if isinstance(statistics, Carried):
        carried, statistics = statistics, statistics.statistics()
    decoder = StreamingDecoder(
        real.decoder,
        segment.style,
        statistics,
        observe=carried.observe if carried else None,
    )
    if carried:
        carried.target = decoder
    outs = []
    for start in range(0, segment.frames, push):
        end = min(segment.frames, start + push)
        if carried and start > 0:
            decoder.set_statistics(carried.statistics())
        outs.append(
            decoder.push(
                segment.asr[..., start:end],
                segment.f0[:, 2 * start : 2 * end],
                segment.n[:, 2 * start : 2 * end],
                segment.harmonics[:, start * SAMPLES_PER_FRAME : end * SAMPLES_PER_FRAME],
            )
        )
    if carried:
        decoder.set_statistics(carried.statistics())
    outs.append(decoder.flush())
    return torch.cat(outs, dim=-1).numpy().ravel()


def snr_db(reference: Any, other: Any) -> float:
    reference, other = np.asarray(reference, np.float64), np.asarray(other, np.float64)
    error = float(np.sum((other - reference) ** 2))
    return 10 * math.log10(float(np.sum(reference**2)) / max(error, 1e-300))


def level_error_db(reference: Any, other: Any) -> float:
    """Mean |level difference| over 25 ms frames within 40 dB of the reference's loudest."""
    frames = min(reference.size, other.size) // SAMPLES_PER_FRAME

    def levels(x: Any) -> Any:
        x = np.asarray(x[: frames * SAMPLES_PER_FRAME], np.float64).reshape(frames, -1)
        return 10 * np.log10(np.mean(x**2, axis=1) + 1e-12)

    ref, oth = levels(reference), levels(other)
    loud = ref > ref.max() - 40
    return float(np.mean(np.abs(ref[loud] - oth[loud])))


def _generator_statistics(real: Real, segment: Segment, frames: int) -> dict[str, Any]:
    """The generator's norms' statistics over its first `frames` frames, run alone in whole."""
    import torch

    from model_server.engines.streaming_decoder import recording_statistics

    body: list[Any] = []
    hook = real.decoder.generator.register_forward_pre_hook(lambda _m, args: body.append(args))
    try:
        with torch.inference_mode(), given_source(real.decoder, segment.harmonics[..., None]):
            real.decoder(segment.asr, segment.f0, segment.n, segment.style)
    finally:
        hook.remove()
    x, s, f0 = body[0]
    har = segment.harmonics[:, : frames * SAMPLES_PER_FRAME, None]
    with (
        torch.inference_mode(),
        given_source(real.decoder, har),
        recording_statistics(real.decoder.generator) as found,
    ):
        real.decoder.generator(x[..., : 2 * frames], s, f0[:, : 2 * frames])
    return {f"generator.{k}": v for k, v in found.items()}


def _blend(a: tuple[Any, Any], wa: float, b: tuple[Any, Any], wb: float) -> tuple[Any, Any]:
    """Two norms' statistics pooled, weighing `wa` and `wb` frames."""
    mean = (wa * a[0] + wb * b[0]) / (wa + wb)
    second = (wa * (a[1] + a[0] ** 2) + wb * (b[1] + b[0] ** 2)) / (wa + wb)
    return mean, second - mean**2


def voice_prior(real: Real, voice: str = VOICE) -> tuple[dict[str, Any], float]:
    """Every norm's statistics over the reference text (its segments' pooled by frames), and
    how many frames they weigh."""
    total: dict[str, Any] = {}
    frames = 0.0
    for phonemes in CALIBRATION_PHONEMES:
        segment = whole_call(real, real.inputs(phonemes, voice))
        for name, stats in segment.statistics.items():
            total[name] = (
                stats if name not in total else _blend(total[name], frames, stats, segment.frames)
            )
        frames += segment.frames
    return total, frames


Rule = Callable[[Real, Segment], dict[str, Any] | Carried]


def unseen(seen: float, frames: float) -> float:
    """`carried_norms`' weight for the prior: as many frames as are still to come (here: not
    yet seen by the norm), at most `PRIOR_FRAMES`."""
    return max(0.0, min(PRIOR_FRAMES, frames - seen))


def steady(_seen: float, _frames: float) -> float:
    """The prior always weighing `PRIOR_FRAMES`."""
    return PRIOR_FRAMES


def fading(seen: float, frames: float) -> float:
    """The prior's weight fading by the frames seen: `PRIOR_FRAMES` less them (and at most
    the frames still to come)."""
    return max(0.0, min(PRIOR_FRAMES - seen, frames - seen))


def rules(prior: dict[str, Any]) -> dict[str, Rule]:
    def body(segment: Segment, generator: dict[str, Any]) -> dict[str, Any]:
        exact = {k: v for k, v in segment.statistics.items() if not k.startswith("generator.")}
        return exact | generator

    def prior_generator(_real: Real, s: Segment) -> dict[str, Any]:
        return body(s, {k: v for k, v in prior.items() if k.startswith("generator.")})

    def first_window(real: Real, s: Segment) -> dict[str, Any]:
        return body(s, _generator_statistics(real, s, min(PUSH, s.frames)))

    def blended(real: Real, s: Segment) -> dict[str, Any]:
        first = _generator_statistics(real, s, min(PUSH, s.frames))
        n = float(min(PUSH, s.frames))
        return body(s, {k: _blend(prior[k], PRIOR_FRAMES, v, n) for k, v in first.items()})

    def carried(weight: Callable[[float, float], float], own: bool = False) -> Rule:
        def rule(real: Real, s: Segment) -> Carried:
            return Carried(real.decoder, body(s, {}), prior, s.frames, weight, own)

        return rule

    def prior_for(group: str) -> Rule:
        def rule(_real: Real, s: Segment) -> dict[str, Any]:
            return s.statistics | {k: v for k, v in prior.items() if k.startswith(group)}

        return rule

    groups = {
        f"oracle but the prior for {name}": prior_for(f"generator.{name}")
        for name in (
            *("noise_res.0.", "resblocks.0.", "resblocks.1.", "resblocks.2."),
            *("noise_res.1.", "resblocks.3.", "resblocks.4.", "resblocks.5."),
        )
    }

    def carried_for(group: str) -> Rule:
        def rule(real: Real, s: Segment) -> Carried:
            return Carried(real.decoder, s.statistics, prior, s.frames, unseen, False, group)

        return rule

    carried_groups = {
        f"oracle but carried for {name}": carried_for(f"generator.{name}")
        for name in (
            *("noise_res.0.", "resblocks.0.", "resblocks.1.", "resblocks.2."),
            *("noise_res.1.", "resblocks.3.", "resblocks.4.", "resblocks.5."),
        )
    }
    return (
        {
            "oracle": lambda _r, s: s.statistics,
            "two-pass (body, then generator, in whole)": lambda _r, s: s.statistics,
            "body exact + generator first window": first_window,
            "body exact + generator voice prior": prior_generator,
            "body exact + generator prior & first window": blended,
            "voice prior for every norm": lambda _r, _s: prior,
            "body exact + generator first 80 frames": lambda r, s: body(
                s, _generator_statistics(r, s, min(80, s.frames))
            ),
            "body exact + generator carried (prior for the frames unseen, at most 96)": carried(
                unseen
            ),
            "body exact + generator carried (prior fading: 96 less the frames seen)": carried(
                fading
            ),
            "body exact + generator carried, each push's own frames counted": carried(unseen, True),
            "body exact + generator carried (prior steady at 96)": carried(steady),
            "body exact + generator carried (prior steady at 96), own frames counted": carried(
                steady, True
            ),
        }
        | groups
        | carried_groups
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--judges", action="store_true", help="DistillMOS and PocketSphinx too")
    parser.add_argument("--rules", default="", help="only the rules whose name has this")
    parser.add_argument("--skip-twin", action="store_true", help="not the graph comparison")
    parser.add_argument(
        "--corpus",
        default="",
        help="instead: the corpus's word errors by rule (prior,oracle,carried,onecall)",
    )
    args = parser.parse_args()
    if args.corpus:
        corpus_rules(args.corpus.split(","))
        return
    import torch

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    real = load(args.threads)
    print(f"loaded in {time.perf_counter() - started:.1f} s")
    print("\n## the torch decoder with the registry's weights against the graph\n")
    print(
        "| sentence | frames | conv_post: torch vs twin | audio (torch x GRAPH_GAIN) vs twin, "
        "the same source STFT | the same, torch's own source STFT | audio, no gain: torch vs "
        "twin | twin vs int8 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    segments = {}
    for name, phonemes in SENTENCES.items():
        inputs = real.inputs(phonemes)
        segment = whole_call(real, inputs)
        segments[name] = segment
        if args.skip_twin:
            continue
        twin, spectrum, post = real.graph_audio(real.twin, inputs)
        int8, _, _ = real.graph_audio(real.int8, inputs)
        same = whole_call(real, inputs, spectrum)
        print(
            f"| {name} | {segment.frames} | {snr_db(post, same.post):.1f} dB "
            f"| {snr_db(twin, GRAPH_GAIN * same.audio):.1f} dB "
            f"| {snr_db(twin, GRAPH_GAIN * segment.audio):.1f} dB "
            f"| {snr_db(twin, same.audio):.1f} dB | {snr_db(int8, twin):.1f} dB |",
            flush=True,
        )
    prior, prior_frames = voice_prior(real)
    print(f"\nvoice prior of {VOICE} over {prior_frames:.0f} frames")
    judges = _judges() if args.judges else None
    print(f"\n## streamed at {PUSH} frames a push against the whole call\n")
    header = "| rule | " + " | ".join(f"{n}: SNR / level err" for n in SENTENCES) + " |"
    if judges:
        header += " MOS | word errors |"
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    if judges:
        whole = [segments[n].audio for n in SENTENCES]
        print(f"| whole call | {' | '.join('-' for _ in SENTENCES)} | {_judged(judges, whole)} |")
    for rule_name, rule in rules(prior).items():
        if args.rules not in rule_name:
            continue
        cells, audios = [], []
        for segment in segments.values():
            audio = stream(real, segment, rule(real, segment))
            audios.append(audio)
            cells.append(
                f"{snr_db(segment.audio, audio):.1f} dB / "
                f"{level_error_db(segment.audio, audio):.2f} dB"
            )
        row = f"| {rule_name} | {' | '.join(cells)} |"
        if judges:
            row += f" {_judged(judges, audios)} |"
        print(row, flush=True)
    print(f"\n{time.perf_counter() - started:.0f} s in all")


def corpus_rules(names: list[str]) -> None:
    """The quality corpus's word errors (PocketSphinx, jm_kumo) through the server's
    synthesizer, in process, by the generator's rule in `--decoder stream` (the body's exact):
    `prior` (the engine's), `oracle` (the segment's own: the torch decoder's whole call),
    `carried` (the prior pooled with what each norm has normalised, its block counted), and
    `onecall` (the int8 graph, one call per segment)."""
    import asyncio

    from kokoro_contract.protocol import SynthesisRequest
    from model_server.engines import streamed
    from model_server.engines.onnx import OnnxEngine, OnnxOptions
    from model_server.engines.streaming_decoder import StreamingDecoder
    from model_server.scheduler import Scheduler
    from model_server.synthesis import Synthesizer
    from model_server.text.g2p import english_g2p
    from quality import corpus, judges
    from quality.wer import total, word_errors

    engine = OnnxEngine(OnnxOptions(decoder="stream"))
    owner = engine._streamed
    assert owner is not None
    opened = streamed.StreamedDecoder.open

    def ruled(rule: str) -> Callable[..., Any]:
        def open_(self: Any, inputs: Any, prior: dict[str, Any]) -> Any:
            segment = opened(self, inputs, prior)
            if rule in ("prior", "onecall", "prior-float") or segment.frames == 0:
                return segment
            _, oracle = self.whole(inputs)
            body = {k: v for k, v in segment.statistics.items() if k not in prior}
            if rule == "oracle":
                fixed = oracle
            else:  # carried: bench's `Carried`, set as each norm meets its input
                n = segment.frames
                carried = Carried(self.decoder, body, prior, n, unseen, own=True)
                fixed = carried.statistics()

            def build() -> Any:
                observe = carried.observe if rule == "carried" else None
                return StreamingDecoder(self.decoder, inputs.style, fixed, observe=observe)

            segment._decoder = self.thread.run(build)
            if rule == "carried":
                carried.target = segment._decoder
            return segment

        return open_

    g2p, asr = english_g2p(), judges.AsrJudge()

    async def run(rule: str) -> str:
        streamed.StreamedDecoder.open = ruled(rule)  # type: ignore[method-assign]
        kernels, owner.kernels = owner.kernels, None if rule == "prior-float" else owner.kernels
        synthesizer = Synthesizer(engine, g2p, Scheduler(1), progressive=rule != "onecall")
        errors = []
        try:
            for reply in corpus.load():
                request = SynthesisRequest(reply.text, VOICE, 1.0, "bench")
                pcm = b"".join([c async for c in synthesizer.stream(request, "k")])
                heard = asr.transcribe(judges.decode(pcm, "pcm"))
                errors.append(word_errors(reply.spoken, heard))
        finally:
            synthesizer.close()
            streamed.StreamedDecoder.open = opened  # type: ignore[method-assign]
            owner.kernels = kernels
        got = total(errors)
        return f"| {rule} | {got.errors}/{got.words} | {got.rate:.3f} |"

    print("\n## the corpus by the generator's rule (--decoder stream)\n")
    print("| rule | misheard | WER |\n|---|---:|---:|")
    for name in names:
        print(asyncio.run(run(name)), flush=True)


def _judges() -> Any:
    from quality import judges

    return judges.MosJudge(), judges.AsrJudge()


def _judged(judge: Any, audios: list[Any]) -> str:
    from quality import judges
    from quality.wer import word_errors

    mos, asr = judge
    scores, errors, words = [], 0, 0
    for audio, reference in zip(audios, WORDS.values(), strict=True):
        samples = judges.resample(np.asarray(audio, np.float32), 24000)
        scores.append(mos.score(samples))
        heard = word_errors(reference, asr.transcribe(samples))
        errors, words = errors + heard.errors, words + heard.words
    return f"{np.mean(scores):.2f} | {errors}/{words}"


if __name__ == "__main__":
    main()
