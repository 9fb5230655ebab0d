"""Both engines' decoder, streamed exactly: every layer's state carried from block to block
(`streaming_decoder.StreamingDecoder` over kokoro's `Decoder`: the onnx engine's with the
registry graph's own weights, `registry_decoder`; the torch engine's its KModel's), so a
segment's audio is one call's, however it is asked for.

A segment's front pass (the engine's: aligned features, F0 and N curves, the harmonic source,
durations) opens a `SegmentStream`, which runs the decoder's body (its frame-rate layers, a
small part of the decoder's compute) over the whole segment at once: its norms' statistics are
then the segment's own, and its output is the whole call's. `take(start, end)` answers the audio of
frames `[start, end)`, pushing that output into the generator in fixed blocks (`blocks`: 16
frames at first, then 32, then 64) as far as those samples need (the generator's lookahead,
about 5 frames, behind the frames pushed). The blocks are the segment's, never the caller's:
how the synthesizer windows a segment (which follows the machine's speed) changes when its audio
is computed, not its samples. Nothing is decoded twice and there is no seam to hide. The
generator's resblocks compute in int8 where this torch has oneDNN (`int8`: the onnx engine's,
on the CPU, as the registry graph's convolutions do).

The one approximation is the instance norms' statistics (Kokoro's AdaIN norms the whole
segment's, which no stream knows before its end):
- the body's exact: recorded in its whole-segment pass;
- the generator's the voice's prior at the segment's length (`LengthPrior`: its statistics
  at three lengths, `LENGTH_CALIBRATION`, computed once per voice and kept in the cache
  directory), the same for every frame of the segment. Over the quality corpus the recogniser
  misheard about as many words with it as with the int8 graph's one call per segment or the
  torch decoder's own one call (its own statistics, the oracle). One prior of long sentences
  (`carried_norms.CALIBRATION_PHONEMES`) made a short segment speak quieter than one call, and
  the prior pooled with what each norm has normalised so far (the rule `carried_norms` gives
  the windows) misheard clearly more: carried statistics move with the segment's opening, not
  with the segment (docs/measured.md, "2026-12-06 (night)" and "2026-12-06 (evening): the
  streamed decoder in the server").

The priors are computed once per voice (`StreamPriors`) over whole calls of the engine's own
front passes. The graph's iSTFT is torch's times `GRAPH_GAIN`: the onnx engine's stream is
scaled by it (`StreamedDecoder`'s `gain`), so it speaks at the level of the graph's whole
calls."""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections import Counter
from collections.abc import Callable, Hashable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor, nn

from kokoro_contract import blends
from model_server.batching import Policy
from model_server.engines.base import CancelToken, FloatAudio, Front, Pause, check_window
from model_server.engines.carried_norms import CALIBRATION_PHONEMES, NormStats, voice_prior
from model_server.engines.int8 import Int8Convs
from model_server.engines.stream_batch import DifferentStates
from model_server.engines.streaming_decoder import Kernels, Statistics, StreamingDecoder
from model_server.errors import SynthesisCancelled, SynthesisFailed
from model_server.windows import Window

T = TypeVar("T")
log = logging.getLogger(__name__)

# the decoder's blocks: these first (a reply's first audio needs ~14 frames past its first
# window), then `LATER_BLOCK` frames each: a push has a cost of its own, so small blocks cost
# more per frame than large ones, and only the first audio is worth them (docs/measured.md,
# "2026-12-06 (evening): the streamed decoder in the server")
FIRST_BLOCKS = (16, 16, 16, 16, 32, 32)
LATER_BLOCK = 64


# The voice's prior for the generator's norms, measured at three lengths: a segment's own
# statistics move with its length (a short one is more of its leading pause and its final fall:
# with one prior of long sentences a short phrase streamed far quieter than one call, its fading
# end trimmed away). Each length's prior is the average, over its phrases, of each
# phrase's own statistics (a whole call of it); a segment reads the two around its length,
# interpolated linearly in 1 / frames (`LengthPrior`). Literal phonemes (espeak's), so the
# priors do not follow the G2P. With them a short segment follows one call's level far more
# closely than under one prior, and a long one as closely as before (docs/measured.md,
# "2026-12-06 (night)").
LENGTH_CALIBRATION: dict[str, tuple[str, ...]] = {
    "short": (  # "Thank you.", "Sure, one moment.", ... 67 frames on average in jm_kumo
        "θˈæŋk ju.",
        "ʃˈʊɹ, wˈʌn mˈOmənt.",
        "OkˈA, ɡˈɑt ɪt.",
        "ɡˈʊd mˈɔɹnɪŋ!",
        "jˈɛs, ʌv kˈɔɹs.",
        "nˈO pɹˈɑbləm æT ˈɔl.",
        "sˈi ju sˈun.",
        "ɹˈIt əwˈA.",
    ),
    "medium": (  # 148 frames on average
        "jʊɹ ˈɔɹdəɹ ʃˈɪpt ðɪs mˈɔɹnɪŋ ænd əɹɹˈIvz ˌɔn fɹˈIdA.",
        "I kæn hˈɛlp ju ʧˈAnʤ jʊɹ flˈIt tʊ ə lˈATəɹ tˈIm.",
        "ðə wˈɛðəɹ təmˈɑɹO lˈʊks sˈʌni wɪð ə lˈIt bɹˈiz.",
    ),
    "long": CALIBRATION_PHONEMES,  # 220 frames on average
}


@dataclass(frozen=True)
class LengthPrior:
    """The generator norms' statistics of a voice at several segment lengths: `points`, each
    (frames, every norm's (mean, variance)), by frames."""

    points: tuple[tuple[float, Statistics], ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "points", tuple(sorted(self.points, key=lambda p: p[0])))

    def at(self, frames: int) -> Statistics:
        """The statistics for a segment of `frames` frames: the two points around it
        interpolated linearly in 1 / frames (their means and second moments), the nearest
        point's outside them."""
        points = self.points
        if frames <= points[0][0]:
            return points[0][1]
        for (f0, a), (f1, b) in itertools.pairwise(points):
            if frames <= f1:
                w = (1 / f0 - 1 / frames) / (1 / f0 - 1 / f1)  # 0 at f0, 1 at f1
                return {k: pooled(a[k], 1 - w, b[k], w) for k in a}
        return points[-1][1]


def blocks(frames: int) -> list[tuple[int, int]]:
    """The blocks `[start, end)` a segment of `frames` frames is pushed in, in order."""
    out: list[tuple[int, int]] = []
    start, sizes = 0, iter(FIRST_BLOCKS)
    while start < frames:
        end = min(frames, start + next(sizes, LATER_BLOCK))
        out.append((start, end))
        start = end
    return out


def pooled(
    a: tuple[Tensor, Tensor], weight_a: float, b: tuple[Tensor, Tensor], weight_b: float
) -> tuple[Tensor, Tensor]:
    """Two norms' statistics (mean, variance) pooled, weighing `weight_a` and `weight_b`."""
    mean = (weight_a * a[0] + weight_b * b[0]) / (weight_a + weight_b)
    second = (weight_a * (a[1] + a[0] ** 2) + weight_b * (b[1] + b[0] ** 2)) / (weight_a + weight_b)
    return mean, second - mean**2


def blended(parts: list[tuple[LengthPrior, float]]) -> LengthPrior:
    """A voice blend's prior from its voices' (each with its share, the shares summing to 1):
    point by point (the same calibration lengths, in the same order), the frames, and each
    norm's mean and variance, weighted by the shares: a blend speaks as one voice between them,
    not as a crowd of them (pooling them as a mixture, with the spread between the voices in the
    variance, was heard further from the blend's one call: docs/measured.md, "Voice blends").
    `carried_norms.blended_stats` is the same rule for the windows decoder."""
    points = []
    for k in range(len(parts[0][0].points)):
        frames = sum(prior.points[k][0] * share for prior, share in parts)
        names = parts[0][0].points[k][1]
        stats = {
            name: (
                sum(prior.points[k][1][name][0] * share for prior, share in parts),
                sum(prior.points[k][1][name][1] * share for prior, share in parts),
            )
            for name in names
        }
        points.append((frames, stats))
    return LengthPrior(tuple(points))


class _PerThread:
    """Forward hooks on the shared decoder that act only for the thread that asked: record the
    norms' statistics (`recording`), or give the generator its harmonic source (`source`)."""

    def __init__(self, decoder: nn.Module) -> None:
        self._local = threading.local()
        for name, module in decoder.named_modules():
            if isinstance(module, nn.InstanceNorm1d):
                module.register_forward_hook(self._recorder(name))
        decoder.generator.m_source.register_forward_hook(self._source)

    def _recorder(self, name: str) -> Callable[[nn.Module, tuple[Tensor, ...], Tensor], None]:
        def record(_module: nn.Module, inputs: tuple[Tensor, ...], _out: Tensor) -> None:
            found = getattr(self._local, "found", None)
            if found is not None:
                x = inputs[0].double()
                found[name] = (x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True))

        return record

    def _source(self, _module: nn.Module, _inputs: Any, out: Any) -> Any:
        given = getattr(self._local, "harmonics", None)
        return out if given is None else (given, *out[1:])

    @contextmanager
    def recording(self, harmonics: Tensor | None = None) -> Iterator[Statistics]:
        found: Statistics = {}
        self._local.found, self._local.harmonics = found, harmonics
        try:
            yield found
        finally:
            self._local.found = self._local.harmonics = None


def decode_body(decoder: nn.Module, asr: Tensor, f0: Tensor, n: Tensor, style: Tensor) -> Tensor:
    """`Decoder.forward` up to its generator (the frame-rate layers): the generator's input,
    (1, channels, 2 x frames)."""
    f0_down = decoder.F0_conv(f0.unsqueeze(1))
    n_down = decoder.N_conv(n.unsqueeze(1))
    x = decoder.encode(torch.cat([asr, f0_down, n_down], dim=1), style)
    asr_res = decoder.asr_res(asr)
    concatenate = True
    for block in decoder.decode:
        if concatenate:
            x = torch.cat([x, asr_res, f0_down, n_down], dim=1)
        x = block(x, style)
        if block.upsample_type != "none":
            concatenate = False
    return x


@dataclass(frozen=True)
class Inputs:
    """A segment's decoder inputs as the front graph gives them, in torch: aligned features
    (1, 512, frames), F0 and N (1, 2 x frames), the style's decoder half (1, 128), the harmonic
    source (1, frames x 600)."""

    asr: Tensor
    f0: Tensor
    n: Tensor
    style: Tensor
    harmonics: Tensor

    @classmethod
    def from_graph(cls, arrays: list[Any] | tuple[Any, ...]) -> Inputs:
        asr, f0, n, style, harmonics = (torch.from_numpy(np.asarray(a, np.float32)) for a in arrays)
        return cls(asr, f0, n, style, harmonics.reshape(1, -1))

    @property
    def frames(self) -> int:
        return int(self.asr.shape[-1])

    @property
    def frame_samples(self) -> int:
        """Samples of audio per frame (the harmonic source's, 600 for Kokoro-82M)."""
        return int(self.harmonics.shape[-1]) // max(self.frames, 1)


class Runner(Protocol):
    """Where a decoder's torch work runs: `run(fn, *args)` answers `fn(*args)`; `step` runs a
    segment's next decoder step (alone, or batched with other segments': `batcher.Batcher`),
    `decoding()` is around a segment's steps for one window."""

    def run(self, fn: Callable[..., T], *args: Any) -> T: ...

    def step(self, stream: SegmentStream, cancel: CancelToken) -> None: ...

    def decoding(self) -> AbstractContextManager[None]: ...

    def batch_curve(self) -> dict[str, float] | None: ...


class _OneByOne:
    """Each segment's steps alone, as they are asked for."""

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        raise NotImplementedError

    def step(self, stream: SegmentStream, cancel: CancelToken) -> None:
        self.run(stream.step)

    def decoding(self) -> AbstractContextManager[None]:
        return nullcontext()

    def batch_curve(self) -> dict[str, float] | None:
        return None


class CallingThread(_OneByOne):
    """The decoder's torch work on the thread that asks: on CUDA, where each engine worker
    queues its kernels on a stream of its own (`kmodel`), so segments overlap on the device."""

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)


class TorchThread(_OneByOne):
    """One thread for all of a decoder's torch work. On the CPU, torch computes in an OpenMP
    team per calling thread: teams of several engine workers, idle or spinning, take the cores
    from the one computing (on a CPU of few cores a segment is markedly slower from a second
    thread than from the thread that loaded the decoder, and slower again from a third:
    docs/measured.md, "2026-12-06 (evening): the streamed decoder in the server"), so every
    segment's blocks run here, one after another, each on all `threads`."""

    def __init__(self, threads: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch-decoder")
        self.run(torch.set_num_threads, threads)

    def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` on the thread, waited for."""
        return self._pool.submit(fn, *args).result()


def runner(threads: int, batch: Policy | None) -> Runner:
    """One thread for a decoder's torch work on `threads` threads (on the CPU the cores'
    owner; on CUDA the one that queues the batches): its segments' steps batched by `batch`
    (`batcher.Batcher`), or each alone (`TorchThread`)."""
    if batch is None:
        return TorchThread(threads)
    from model_server.engines.batcher import Batcher

    return Batcher(threads, batch)


class StreamedDecoder:
    """An engine's decoder (kokoro's `Decoder`), shared by every segment's `SegmentStream`,
    computing through its `Runner` (on the CPU a `TorchThread`), its audio times `gain` (the
    onnx engine's: `registry_decoder.GRAPH_GAIN`)."""

    def __init__(
        self, decoder: nn.Module, thread: Runner, int8: bool = False, gain: float = 1.0
    ) -> None:
        self.thread = thread
        self.gain = gain
        self.decoder = decoder.eval()
        self.device = next(decoder.parameters()).device
        # the generator's resblocks' convolutions in int8 (`int8.Int8Convs`), or float
        self.kernels: Kernels | None = Int8Convs().kernel if int8 else None
        self._hooks = _PerThread(self.decoder)
        self.generator_norms = sorted(
            name
            for name, m in self.decoder.named_modules()
            if isinstance(m, nn.InstanceNorm1d) and name.startswith("generator.")
        )

    def whole(self, inputs: Inputs) -> tuple[FloatAudio, Statistics]:
        """One whole call over `inputs` (the front pass's harmonic source), times `gain`, and
        every norm's statistics in it (the oracle)."""
        return self.thread.run(self._whole, inputs)

    def _whole(self, inputs: Inputs) -> tuple[FloatAudio, Statistics]:
        with torch.inference_mode(), self._hooks.recording(inputs.harmonics[..., None]) as found:
            audio = self.decoder(inputs.asr, inputs.f0, inputs.n, inputs.style)
        return (audio * self.gain).float().cpu().numpy().ravel(), dict(found)

    def body(self, inputs: Inputs) -> tuple[Tensor, Statistics]:
        """One pass of the body (its frame-rate layers) over the whole segment: its output (the
        generator's input, (1, channels, 2 x frames)) and its norms' statistics."""
        return self.thread.run(self._body, inputs)

    def _body(self, inputs: Inputs) -> tuple[Tensor, Statistics]:
        with torch.inference_mode(), self._hooks.recording() as found:
            out = decode_body(self.decoder, inputs.asr, inputs.f0, inputs.n, inputs.style)
        return out, dict(found)

    def prior(self, generator: Statistics, frames: float) -> NormStats:
        """The generator's statistics as `NormStats` (sums over `frames` frames, by
        `generator_norms`' order), to keep in the cache directory."""
        sums = tuple(
            (generator[k][0] * frames).float().cpu().numpy().reshape(-1)
            for k in self.generator_norms
        )
        squares = tuple(
            ((generator[k][1] + generator[k][0] ** 2) * frames).float().cpu().numpy().reshape(-1)
            for k in self.generator_norms
        )
        return NormStats(sums, squares, frames)

    def prior_statistics(self, stats: NormStats) -> Statistics:
        """`prior`'s inverse: each generator norm's (mean, variance), (1, channels, 1)."""
        out: Statistics = {}
        for name, s, q in zip(self.generator_norms, stats.sums, stats.squares, strict=True):
            mean, second = (
                torch.from_numpy(np.asarray(a, np.float64)).reshape(1, -1, 1).to(self.device)
                / stats.frames
                for a in (s, q)
            )
            out[name] = (mean, second - mean**2)
        return out

    def open(self, inputs: Inputs, prior: Statistics) -> SegmentStream:
        """A segment's stream: its body's statistics computed now (a whole-segment body pass),
        the generator's `prior`'s."""
        return SegmentStream(self, inputs, prior)

    def front(self, durations: Any, inputs: Inputs, prior: LengthPrior) -> Front:
        """A streamed segment's `Front`: its stream opened with `prior` at its length."""
        stream = self.open(inputs, prior.at(inputs.frames))
        return Front(inputs.frames, durations, inputs.frame_samples, stream)


def decode_window(front: Front, window: Window, cancel: CancelToken) -> FloatAudio:
    """An engine's `decode` of a streamed segment: the audio of `window`'s frames (its windows
    in order, with no context)."""
    stream = front.features
    if not isinstance(stream, SegmentStream):
        raise SynthesisFailed("a front pass of another engine")
    check_window(window, front.frames)
    if window.left or window.right:
        raise SynthesisFailed("the streamed decoder's windows have no context")
    return stream.take(window.start, window.end, cancel)


class StreamPriors:
    """A streamed decoder's priors by voice (`LengthPrior`): from memory, the cache directory
    (`directory`, for the model `model_key`), or computed: one whole call over each phrase of
    `LENGTH_CALIBRATION` (about 35 s of speech, once per voice), each from the engine's own
    front pass (`inputs(phonemes, voice)`, at speed 1). A voice's pack (`pack(voice)`, an
    array: it keys the prior in the directory) is read only when its prior is not in memory.

    A voice's first stream waits for its prior (seconds on a CPU); `prepare` makes it ahead,
    in the background, giving way to live work between its whole calls."""

    def __init__(
        self,
        decoder: StreamedDecoder,
        directory: Path,
        model_key: str,
        inputs: Callable[[str, str], Inputs],
        pack: Callable[[str], Any],
    ) -> None:
        self._decoder = decoder
        self._directory = directory
        self._key = model_key
        self._inputs = inputs
        self._pack = pack
        self._known: dict[str, LengthPrior] = {}
        self._lock = threading.Lock()  # one calibration at a time
        self._wanted: Counter[str] = Counter()  # streams waiting for a voice's prior now
        self._wanted_lock = threading.Lock()

    def __call__(self, voice: str) -> LengthPrior:
        """`voice`'s prior."""
        with self._wanted_lock:
            self._wanted[voice] += 1
        try:
            return self._prior(voice, None)
        finally:
            with self._wanted_lock:
                self._wanted[voice] -= 1
                if not self._wanted[voice]:
                    del self._wanted[voice]

    def prepare(self, voice: str, pause: Pause) -> bool:
        """`voice`'s prior made ahead of its first stream (at once when it is known or kept);
        `pause` is called before each whole call of its calibration (`Pause`), told whether a
        stream waits for a prior now. A stream waiting for this voice's lets it go on at
        once; one waiting for another voice's makes it give way (False: nothing kept, ask
        again later), so no stream waits behind a calibration it did not ask for."""

        def between() -> None:
            if voice not in self._wanted:
                pause(lambda: bool(self._wanted))
                if self._wanted and voice not in self._wanted:
                    raise _GiveWay

        try:
            self._prior(voice, between)
        except _GiveWay:
            return False
        return True

    def _prior(self, voice: str, pause: Callable[[], None] | None) -> LengthPrior:
        if blends.is_blend(voice):  # its voices' (made again each time: no end to blends)
            parts = blends.parse_blend(voice).shares
            return blended([(self._prior(name, pause), share) for name, share in parts])
        with self._lock:
            known = self._known.get(voice)
            if known is not None:
                return known
            pack = self._pack(voice)
            points = []
            for name, phrases in LENGTH_CALIBRATION.items():
                stats = voice_prior(
                    self._directory,
                    voice,
                    "\n".join([self._key, name, *phrases]),
                    pack,
                    len(self._decoder.generator_norms),
                    functools.partial(self._calibrate, voice, phrases, pause),
                )
                points.append((stats.frames, self._decoder.prior_statistics(stats)))
            prior = LengthPrior(tuple(points))
            self._known[voice] = prior
            return prior

    def _calibrate(
        self, voice: str, phrases: tuple[str, ...], pause: Callable[[], None] | None
    ) -> NormStats:
        """The generator norms' statistics of `phrases`, each phrase's own (a whole call)
        averaged, at their average length; `pause()` before each call, when given."""
        total: Statistics = {}
        frames = []
        for count, phonemes in enumerate(phrases):
            if pause is not None:
                pause()
            inputs = self._inputs(phonemes, voice)
            _, found = self._decoder.whole(inputs)
            for name in self._decoder.generator_norms:
                stats = found[name]
                total[name] = pooled(total[name], count, stats, 1) if count else stats
            frames.append(inputs.frames)
        return self._decoder.prior(total, sum(frames) / len(frames))


class SegmentStream:
    """One segment's audio, frame span after frame span (`take`, in order), pushed into its
    decoder in the segment's fixed `blocks`; `Front.features` of a streamed segment."""

    def __init__(self, owner: StreamedDecoder, inputs: Inputs, prior: Statistics) -> None:
        self.inputs = inputs
        self.frames = inputs.frames
        self.frame_samples = inputs.frame_samples
        self._blocks = blocks(self.frames)
        self._pushed = 0  # blocks pushed
        self._audio: list[Tensor] = []  # computed, not yet taken
        self._computed = 0  # samples computed
        self._taken = 0  # samples taken
        self._decoder: StreamingDecoder | None = None
        if self.frames == 0:
            return
        # the body's own, the generator's the voice's (docstring); the body's output is the
        # whole call's, so only the generator streams
        self._body, body_statistics = owner.body(inputs)
        self.statistics = body_statistics | prior
        self._thread = owner.thread
        self._gain = owner.gain
        self._decoder = self._thread.run(
            lambda: StreamingDecoder(
                owner.decoder, inputs.style, self.statistics, kernels=owner.kernels
            )
        )

    @property
    def pushed(self) -> int:
        """How many of the segment's blocks have gone into the generator."""
        return self._pushed

    @property
    def computed(self) -> int:
        """Samples computed so far (taken or not)."""
        return self._computed

    @property
    def next_start(self) -> int:
        """The frame the next `take` starts at."""
        return self._taken // self.frame_samples

    def take(self, start: int, end: int, cancel: CancelToken) -> FloatAudio:
        """The audio of frames `[start, end)` (`start` where the last ended), times the
        decoder's `gain`; `SynthesisCancelled` between blocks when `cancel` fires."""
        if start != self.next_start or not start <= end <= self.frames:
            raise SynthesisFailed(
                f"frames [{start}, {end}) of a segment of {self.frames}, whose next starts at "
                f"{self.next_start}"
            )
        wanted = end * self.frame_samples
        with self._thread.decoding():
            while self._computed < wanted:
                if cancel.cancelled:
                    raise SynthesisCancelled()
                self._thread.step(self, cancel)
        return self._thread.run(self._collect, wanted)

    def _collect(self, wanted: int) -> FloatAudio:
        """The samples computed up to `wanted`, taken."""
        audio = torch.cat(self._audio, dim=-1).reshape(-1) if self._audio else torch.zeros(0)
        n = wanted - self._taken
        out, rest = audio[:n], audio[n:]
        self._audio = [rest] if rest.numel() else []
        self._taken = wanted
        return np.asarray((out * self._gain).float().cpu().numpy(), dtype=np.float32)

    def batch_key(self) -> Hashable | None:
        """What the next step may be batched with: a block of as many frames, the segment's
        first or not (None: the flush, which runs alone). After its first block a stream's
        state has the same shapes wherever it is in its segment (its caches are full), so this
        stands for `stream_batch.signature`, which costs a walk of every layer;
        `step_together` checks the states as it stacks them."""
        if self._decoder is None or self._pushed >= len(self._blocks):
            return None
        return self.next_frames, self._pushed == 0

    @property
    def next_frames(self) -> int:
        """The frames of the next block pushed (0: none is left)."""
        if self._pushed >= len(self._blocks):
            return 0
        a, b = self._blocks[self._pushed]
        return b - a

    def _block(self) -> tuple[Tensor, Tensor]:
        """The next block's generator input and harmonic source."""
        a, b = self._blocks[self._pushed]
        n = self.frame_samples
        return self._body[..., 2 * a : 2 * b], self.inputs.harmonics[:, a * n : b * n]

    def step(self) -> None:
        """The next block pushed (the flush after the last), on the decoder's thread."""
        decoder = self._decoder
        assert decoder is not None
        with torch.inference_mode():
            if self._pushed < len(self._blocks):
                out = decoder.push_generator(*self._block())
            elif self._pushed == len(self._blocks):
                out = decoder.flush()
            else:
                raise SynthesisFailed(
                    f"{self._computed} samples from {self.frames} frames: the decoder gave "
                    "fewer than its frames"
                )
        self._took(out)

    @staticmethod
    def step_together(streams: list[SegmentStream]) -> None:
        """The next block of each stream (of one `batch_key`), pushed as one batch (each alone
        where their states differ after all)."""
        blocks = [s._block() for s in streams]
        try:
            outs = StreamingDecoder.push_generator_together(
                [s._decoder for s in streams if s._decoder is not None],
                [body for body, _ in blocks],
                [source for _, source in blocks],
            )
        except DifferentStates:
            log.warning("segments of one batch key whose states differ: each stepped alone")
            for stream in streams:
                stream.step()
            return
        for stream, out in zip(streams, outs, strict=True):
            stream._took(out)

    def _took(self, out: Tensor) -> None:
        self._pushed += 1
        self._audio.append(out.reshape(-1))
        self._computed += int(out.numel())


class _GiveWay(Exception):
    """A calibration made ahead stops for a stream that waits for another voice's prior."""
