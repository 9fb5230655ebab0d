"""Kokoro's decoder streamed with cached state (torch): frames in, audio out, as one call.

The `kokoro` package's `Decoder` (its weights, its modules' own hyper-parameters) rebuilt from
the streaming layers of `streaming`: every convolution keeps the inputs its next output reads,
the transposed convolutions and the iSTFT their overlap, and where branches of different
latencies meet (the residual blocks, the body's concatenations of its input features, the
generator's harmonic branch against its upsampled one) a `Join` holds the branch that is ahead.
A segment's frames are pushed in windows of any size (`push`: aligned features, F0 and N
curves, the harmonic source's samples for those frames), then `flush`ed; each push answers the
audio its frames determine, so the audio comes a fixed lookahead behind the frames (with
Kokoro-82M's layers 7,985 samples, 13.3 frames: the decoder's right receptive field), nothing
is decoded twice and there is no seam. The harmonic source, which the generator's branches read
only a little ahead of the body's output, is held back before it runs ahead (`_Gate`): its
samples `source_ahead` frames ahead of the body's output (one channel), each stage's share of its
STFT as far as the stage's branch reads (22 channels), rather than in the joins after the noise
convolutions (256 and 128 channels), so a stream holds less state between pushes
(docs/measured.md, "2026-12-06: a cached-state streaming decoder (torch), the norms' statistics
given").

Layer by layer (DESIGN.md §10): the body (`F0_conv`/`N_conv`, `encode`, `asr_res`, the four
`decode` blocks with the depthwise transposed `pool`), then the generator (the STFT of the
harmonic source, given whole per segment as the engine's front pass makes it; per stage the
noise convolution and its `AdaINResBlock1`, `ups`, the reflection pad of the last stage, the
mean of the resblocks with their Snake activations; `conv_post`, exp and sin, the iSTFT).

Kokoro's AdaIN norms are instance norms: each channel's mean and variance over the whole
segment, which no window knows before the segment is over. Here each norm takes its statistics
from outside (`Statistics`: a mean and a variance per channel, by the norm's module name under
the decoder). With the whole call's own, recorded by `recording_statistics` around one whole
call (the *oracle*), the streamed audio is that call's to float precision; any other source of
statistics (a prior, a whole-segment body pass) is the only approximation left. They may change
between pushes (`set_statistics`, e.g. carried from what the norms have seen so far, which
`observe` tells), but what was pushed keeps the statistics it was normalised by.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model_server.engines import stream_batch
from model_server.engines.streaming import (
    ISTFT,
    Join,
    Pad,
    Parallel,
    Pointwise,
    Seq,
    conv1d,
    conv_transpose1d,
    identity,
    stft,
)

# Each norm's statistics over the whole segment: (mean, biased variance), (1, channels, 1).
Statistics = dict[str, tuple[Tensor, Tensor]]
# told each norm's input (by the norm's name) as a push normalises it: (1, channels, steps)
Observer = Callable[[str, Tensor], None]
# a convolution's valid convolution, computed another way than float `F.conv1d` (or None: that)
Kernels = Callable[[nn.Conv1d], Callable[[Tensor], Tensor]]


@contextmanager
def recording_statistics(decoder: nn.Module) -> Iterator[Statistics]:
    """Inside this block, every instance norm under `decoder` records the mean and variance of
    its input over time (float64) in the dictionary given, by module name: run one whole call
    inside it to get the oracle statistics."""
    found: Statistics = {}
    handles = []

    def hook(name: str) -> Callable[[nn.Module, tuple[Tensor, ...], Tensor], None]:
        def record(_module: nn.Module, inputs: tuple[Tensor, ...], _out: Tensor) -> None:
            x = inputs[0].double()
            found[name] = (x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True))

        return record

    for name, module in decoder.named_modules():
        if isinstance(module, nn.InstanceNorm1d):
            handles.append(module.register_forward_hook(hook(name)))
    try:
        yield found
    finally:
        for handle in handles:
            handle.remove()


class _Norms:
    """Every norm's statistics, as the norms read them at each push: by name, from the
    `Statistics` last set, each AdaIN folded into one scale and shift per channel (its
    normalisation by the mean and 1 / sqrt(variance + eps), its affine weight and bias, the
    style's 1 + gamma and beta), so a norm is one pass over its input (`adain`)."""

    STATE = ("_folded",)  # a stream's own rows when streams are pushed together

    def __init__(self, statistics: Statistics, dtype: Any, observe: Observer | None) -> None:
        self.statistics = statistics
        self.observe = observe
        self._dtype = dtype
        self._eps: dict[str, float] = {}  # the norms built so far, by name
        # each norm's affine weight and bias (or None), the style's 1 + gamma and beta
        self._affine: dict[str, tuple[Tensor | None, Tensor | None, Tensor, Tensor]] = {}
        self._folded: dict[str, tuple[Tensor, Tensor]] = {}  # scale, shift

    def add(
        self,
        name: str,
        eps: float,
        affine: tuple[Tensor | None, Tensor | None],
        gamma: Tensor,
        beta: Tensor,
    ) -> None:
        """A norm built, with its `affine` weight and bias (None, None: none) and its AdaIN's
        `gamma` and `beta`: it has statistics now, or `KeyError`."""
        if name not in self.statistics:
            raise KeyError(f"no statistics for the norm {name}")
        self._eps[name] = eps
        self._affine[name] = (*affine, 1 + gamma, beta)
        self._folded[name] = self._fold(name, self.statistics[name])

    def set(self, statistics: Statistics) -> None:
        """Every norm's statistics from now on (`KeyError`, nothing changed, where one has
        none)."""
        for name in self._eps:
            if name not in statistics:
                raise KeyError(f"no statistics for the norm {name}")
        self._folded = {n: self._fold(n, statistics[n]) for n in self._eps}
        self.statistics = statistics

    def _fold(self, name: str, stats: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """`adain`'s scale and shift for `name` with `stats` (computed in float64)."""
        weight, bias, scale, beta = (None if t is None else t.double() for t in self._affine[name])
        assert scale is not None
        assert beta is not None
        mean, var = (t.double() for t in stats)
        inverse = torch.rsqrt(var + self._eps[name])
        if weight is not None and bias is not None:
            k = inverse * weight * scale
            shift = (bias - mean * inverse * weight) * scale + beta
        else:
            k, shift = inverse * scale, beta - mean * inverse * scale
        return k.to(self._dtype), shift.to(self._dtype)

    def adain(self, name: str, x: Tensor) -> Tensor:
        """`AdaIN1d` of `x` by the norm `name`'s statistics: (1 + gamma) x (its normalised
        input, times its affine weight, plus its bias) + beta, as one scale and shift."""
        if self.observe is not None:
            self.observe(name, x)
        k, shift = self._folded[name]
        return torch.addcmul(shift, x, k)


@dataclass(frozen=True)
class _Build:
    """What every layer is built with: the style's decoder half, the norms' statistics, the
    norms' names, the dtype the decoder computes in, how the generator's resblocks'
    convolutions compute (`kernels`: None, in float)."""

    style: Tensor
    norms: _Norms
    names: dict[nn.Module, str]
    dtype: Any
    kernels: Kernels | None

    @property
    def rows(self) -> bool:
        """Whether the generator's float convolutions compute a batch row by row: where its
        resblocks' are quantised (`kernels`), which would turn a float difference between a
        row batched and alone into a different rounding (`streaming.row_by_row`)."""
        return self.kernels is not None

    def conv(self, module: nn.Conv1d) -> Seq:
        """A generator resblock's convolution, streamed (through `kernels` when given)."""
        return conv1d(module, None if self.kernels is None else self.kernels(module))

    def adain(self, module: nn.Module) -> Pointwise:
        """`AdaIN1d` with its norm's statistics given from outside (`_Norms`, read at each
        push): a scale and a shift per channel."""
        norm = module.norm
        name = self.names[norm]
        norms = self.norms
        h = module.fc(self.style)
        gamma, beta = torch.chunk(h.view(h.size(0), h.size(1), 1), chunks=2, dim=1)
        weight = bias = None
        if norm.affine:
            weight, bias = norm.weight.view(1, -1, 1), norm.bias.view(1, -1, 1)
        norms.add(name, norm.eps, (weight, bias), gamma, beta)
        return Pointwise(lambda x: norms.adain(name, x))


# frames of the harmonic source let in ahead of the body's output: the fewest that do not delay
# the audio (1 delays it by 360 samples): Kokoro's first stage's source branch reads 224 STFT
# steps (1,120 samples, 3.7 half frames) past its upsampled input
SOURCE_AHEAD = 2


class _Gate:
    """Steps of an input held back until the branch it feeds reads them: `lead` steps are let
    through before the branch has read any; `release(x, more)` takes `x` in, lets `more` steps
    more through (None: everything) and gives what is held as far as it may. What it may let
    through is kept relative (not a count since the segment began), so two streams at other
    places of their segments hold the same state when they hold as much (`stream_batch`)."""

    STATE = ("_held", "_allowed")

    def __init__(self, lead: int) -> None:
        self._held: Tensor | None = None
        self._allowed = lead  # steps it may still let through

    def release(self, x: Tensor, more: int | None) -> Tensor:
        held = x if self._held is None else torch.cat([self._held, x], dim=-1)
        size = held.shape[-1]
        if more is not None:
            self._allowed += more
        ready = size if more is None else min(size, self._allowed)
        self._held = held[..., ready:]
        self._allowed -= ready
        return held[..., :ready]

    def state_bytes(self) -> int:
        t = self._held
        return 0 if t is None else int(t.numel() * t.element_size())


def _reach(conv: nn.Module) -> int:
    """How many input steps past its output's index a (padded) convolution reads."""
    return int(conv.dilation[0] * (conv.kernel_size[0] - 1) - conv.padding[0])


def _source_reach(noise_conv: nn.Module, res: nn.Module) -> tuple[int, int]:
    """A stage's source branch (its noise convolution, then its `AdaINResBlock1`): the source
    steps per output step, and how many source steps past `stride x` its output's index it
    reads."""
    res_reach = sum(_reach(c1) + _reach(c2) for c1, c2 in zip(res.convs1, res.convs2, strict=True))
    stride = int(noise_conv.stride[0])
    return stride, _reach(noise_conv) + stride * res_reach


_RSQRT2 = torch.rsqrt(torch.tensor(2))  # AdainResBlk1d's (residual + shortcut) scale


def _body_block(block: nn.Module, build: _Build) -> Parallel:
    """`AdainResBlk1d`: norm, LeakyReLU, (the transposed `pool`), conv, norm, LeakyReLU, conv,
    beside the (upsampled) 1x1 shortcut; dropout is the identity at inference."""
    upsample = block.upsample_type != "none"
    residual = Seq(
        build.adain(block.norm1),
        Pointwise(block.actv),
        conv_transpose1d(block.pool) if upsample else identity(),
        conv1d(block.conv1),
        build.adain(block.norm2),
        Pointwise(block.actv),
        conv1d(block.conv2),
    )
    shortcut = Seq(
        Pointwise(lambda x: x.repeat_interleave(2, dim=-1)) if upsample else identity(),
        conv1d(block.conv1x1) if block.learned_sc else identity(),
    )
    return Parallel([residual, shortcut], lambda r, s: (r + s) * _RSQRT2)


def _snake(alpha: Tensor) -> Pointwise:
    """x + sin(alpha x)^2 / alpha, in four passes over x (the sine in place, its square and
    the sum as one `addcmul`)."""
    a = alpha.detach()
    inverse = 1 / a

    def snake(x: Tensor) -> Tensor:
        s = torch.sin_(a * x)
        return torch.addcmul(x, s, s * inverse)

    return Pointwise(snake)


def _resblock1(block: nn.Module, build: _Build) -> Seq:
    """`AdaINResBlock1`: three residual steps of norm, Snake, dilated conv, norm, Snake, conv."""
    steps = []
    for c1, c2, n1, n2, a1, a2 in zip(
        block.convs1,
        block.convs2,
        block.adain1,
        block.adain2,
        block.alpha1,
        block.alpha2,
        strict=True,
    ):
        branch = Seq(
            build.adain(n1), _snake(a1), build.conv(c1), build.adain(n2), _snake(a2), build.conv(c2)
        )
        steps.append(Parallel([branch, identity()], torch.add))  # xt + x
    return Seq(*steps)


def _mean(*xs: Tensor) -> Tensor:
    total = xs[0]
    for x in xs[1:]:
        total = total + x
    return total / len(xs)


def _cat(*xs: Tensor) -> Tensor:
    return torch.cat(xs, dim=1)


def _through(stream: Any, final: bool, *xs: Tensor) -> Tensor:
    """`stream`'s answer to `xs`; when `final`, its flush after it (the input is over)."""
    y = stream.push(*xs)
    return torch.cat([y, stream.flush()], dim=-1) if final else y


@dataclass(frozen=True)
class _Stage:
    """One of the generator's upsampling stages, streamed."""

    PARTS = ("upsampled", "noise", "add", "mix", "source")

    upsampled: Seq  # LeakyReLU 0.1, ups[i] (and the last stage's reflection pad)
    noise: Seq  # noise_convs[i], noise_res[i]
    add: Join  # x + x_source
    mix: Parallel  # the mean of the stage's resblocks
    source: _Gate  # the source's STFT, held until the branch reads it (its reach let in first)
    stride: int  # source steps per step of the stage


class StreamingDecoder:
    """One segment through Kokoro's decoder, window after window, with every layer's state
    carried: `push(asr, f0, n, harmonics)` for the next frames (`asr` (1, hidden, frames),
    `f0` and `n` (1, 2 x frames), `harmonics` (1, frames x samples per frame), in the
    decoder's dtype and device), then `flush()`; the audio joined is one whole call's (with
    the whole call's norm statistics). Cancelling between windows is dropping the object.

    The norms' statistics are read at each push: `set_statistics` between pushes changes them
    for the frames pushed next (a rule that carries them as the segment streams); `observe`,
    when given, is told each norm's input as a push comes to normalise it, just before (a
    `set_statistics` from it applies to that input already). `kernels`, when given, computes
    the generator's resblocks' convolutions (nearly all of the decoder's multiply-adds) another
    way, e.g. `int8.Int8Convs.kernel`; the body's stay float, as its errors reach every
    sample after it (docs/measured.md, "2026-12-06 (night): the stream in int8, the generator
    alone, a prior by length, the default").

    Streams of several segments (one decoder, each its own style and statistics) whose states
    have the same shapes are pushed as one batch by `push_generator_together`."""

    STATE = ("_like",)
    PARTS = (
        "_f0",
        "_n",
        "_asr_res",
        "_encode_in",
        "_encode",
        "_decode",
        "_harmonics",
        "_source",
        "_stages",
        "_post",
        "_norms",
    )

    def __init__(
        self,
        decoder: nn.Module,
        style: Tensor,
        statistics: Statistics,
        source_ahead: int = SOURCE_AHEAD,
        observe: Observer | None = None,
        kernels: Kernels | None = None,
    ) -> None:
        gen = decoder.generator
        self._per_half_frame = int(gen.f0_upsamp.scale_factor)  # source samples per F0 step
        # source samples not yet given to the generator (`source_ahead` frames let in first)
        self._harmonics = _Gate(2 * source_ahead * self._per_half_frame)
        if not hasattr(gen.stft, "window"):
            raise ValueError("a generator without torch's STFT (disable_complex) is not streamed")
        dtype = next(decoder.parameters()).dtype
        names = {module: name for name, module in decoder.named_modules()}
        self._norms = _Norms(statistics, dtype, observe)
        build = _Build(style.to(dtype), self._norms, names, dtype, kernels)
        with torch.inference_mode():
            # the body, at the frame rate (2 x frames for the F0 and N curves, and after pool)
            self._f0 = conv1d(decoder.F0_conv)
            self._n = conv1d(decoder.N_conv)
            self._asr_res = Seq(*(conv1d(m) for m in decoder.asr_res))
            self._encode_in = Join(_cat, 3)
            self._encode = _body_block(decoder.encode, build)
            self._decode = [(Join(_cat, 4), _body_block(b, build)) for b in decoder.decode]
            self._concatenated = []  # Decoder.forward stops concatenating after the upsampling
            concatenate = True
            for block in decoder.decode:
                self._concatenated.append(concatenate)
                if block.upsample_type != "none":
                    concatenate = False
            # the generator
            window = gen.stft.window.to(dtype)
            n_fft, hop = gen.stft.filter_length, gen.stft.hop_length
            self._source = Seq(
                stft(n_fft, hop, window),
                # atan2 for `torch.angle`: the same value, but computed alike at every position
                # of a batch (angle's vectorised loop is not), so rows batched are rows alone
                Pointwise(lambda z: torch.cat([torch.abs(z), torch.atan2(z.imag, z.real)], dim=1)),
            )
            self._stages: list[_Stage] = []
            k = gen.num_kernels
            pad_left, pad_right = gen.reflection_pad.padding  # the last stage's: (1, 0)
            for i in range(gen.num_upsamples):
                last = i == gen.num_upsamples - 1
                stride, reach = _source_reach(gen.noise_convs[i], gen.noise_res[i])
                self._stages.append(
                    _Stage(
                        Seq(
                            Pointwise(lambda x: F.leaky_relu(x, negative_slope=0.1)),
                            conv_transpose1d(gen.ups[i], build.rows),
                            Pad(pad_left, pad_right, "reflect") if last else identity(),
                        ),
                        Seq(
                            conv1d(gen.noise_convs[i], rows=build.rows),
                            _resblock1(gen.noise_res[i], build),
                        ),
                        Join(torch.add, 2),
                        Parallel(
                            [_resblock1(gen.resblocks[i * k + j], build) for j in range(k)], _mean
                        ),
                        _Gate(reach),
                        stride,
                    )
                )
            bins = gen.post_n_fft // 2 + 1
            self._post = Seq(
                Pointwise(F.leaky_relu),
                conv1d(gen.conv_post, rows=build.rows),
                Pointwise(
                    lambda x: torch.exp(x[:, :bins]) * torch.exp(torch.sin(x[:, bins:]) * 1j)
                ),
                ISTFT(n_fft, hop, window),
            )
        # what the first push was (empty, for the flush): the whole decoder's four inputs, or
        # the generator's two (`push_generator`)
        self._like: tuple[Tensor, ...] | None = None

    @property
    def statistics(self) -> Statistics:
        """The norms' statistics the next push normalises by."""
        return self._norms.statistics

    def set_statistics(self, statistics: Statistics) -> None:
        """The norms' statistics from the next push on (every norm's, or `KeyError` and none
        changed): what was pushed before keeps the statistics it was normalised by, as the
        audio it gave (and the layers' state) already holds them."""
        with torch.inference_mode():
            self._norms.set(statistics)

    def push(self, asr: Tensor, f0: Tensor, n: Tensor, harmonics: Tensor) -> Tensor:
        """The audio (1, 1, samples) the frames pushed so far determine, after what came."""
        self._first((asr, f0, n, harmonics))
        with torch.inference_mode():
            return self._step(asr, f0, n, harmonics, final=False)

    def push_generator(self, body: Tensor, harmonics: Tensor) -> Tensor:
        """As `push`, for a caller that has the body's output already (the generator's input,
        (1, channels, 2 x frames), as `Decoder.forward` computes it over the whole segment):
        only the generator streams, so the audio trails the frames by the generator's
        lookahead alone (about 5 frames, not 13.3). Not mixed with `push` in one stream."""
        self._first((body, harmonics))
        with torch.inference_mode():
            return self._generator(body, harmonics, final=False)

    @staticmethod
    def push_generator_together(
        decoders: list[StreamingDecoder], bodies: list[Tensor], harmonics: list[Tensor]
    ) -> list[Tensor]:
        """`push_generator` of each decoder with its body output and harmonic source, as one
        batch (`stream_batch.together`): the decoders are streams of one `StreamingDecoder`'s
        decoder with the same `signature` and are given the same number of frames. Each
        answer is the decoder's own, as alone (up to the order of sums in a batched kernel)."""
        for decoder, body, source in zip(decoders, bodies, harmonics, strict=True):
            decoder._first((body, source))
        with torch.inference_mode():
            return stream_batch.together(
                decoders,
                list(zip(bodies, harmonics, strict=True)),
                lambda d, body, source: d._generator(body, source, final=False),
            )

    def _first(self, inputs: tuple[Tensor, ...]) -> None:
        if self._like is None:
            self._like = tuple(t[..., :0] for t in inputs)
        elif len(self._like) != len(inputs):
            raise RuntimeError("a stream is pushed the whole decoder's inputs or the generator's")

    def flush(self) -> Tensor:
        """The rest of the segment's audio: the input is over."""
        if self._like is None:
            raise RuntimeError("flush before any push")
        with torch.inference_mode():
            if len(self._like) == 2:
                body, harmonics = self._like
                return self._generator(body, harmonics, final=True)
            asr, f0, n, harmonics = self._like
            return self._step(asr, f0, n, harmonics, final=True)

    def _step(self, asr: Tensor, f0: Tensor, n: Tensor, harmonics: Tensor, final: bool) -> Tensor:
        f0_down = _through(self._f0, final, f0.unsqueeze(1))
        n_down = _through(self._n, final, n.unsqueeze(1))
        x = _through(self._encode_in, final, asr, f0_down, n_down)
        x = _through(self._encode, final, x)
        asr_res = _through(self._asr_res, final, asr)
        for (join, block), concatenate in zip(self._decode, self._concatenated, strict=True):
            if concatenate:
                x = _through(join, final, x, asr_res, f0_down, n_down)
            x = _through(block, final, x)
        return self._generator(x, harmonics, final)

    def _generator(self, x: Tensor, harmonics: Tensor, final: bool) -> Tensor:
        # the source goes in only as far ahead of the body as its branches read: what it would
        # run ahead by waits here, one channel, not in the delay lines of 256 and 128 after it
        ahead = x.shape[-1] * self._per_half_frame
        harmonics = self._harmonics.release(harmonics, None if final else ahead)
        har = _through(self._source, final, harmonics.unsqueeze(1))
        for stage in self._stages:
            x = _through(stage.upsampled, final, x)
            # and each stage's branch reads its STFT only as far as the stage has come
            upto = stage.stride * x.shape[-1]
            source = stage.source.release(har, None if final else upto)
            x_source = _through(stage.noise, final, source)
            x = _through(stage.add, final, x, x_source)
            x = _through(stage.mix, final, x)
        return _through(self._post, final, x)

    def state_bytes(self) -> dict[str, int]:
        """What each part holds between pushes (its caches and delay lines), in bytes."""
        parts: dict[str, Any] = {
            "F0_conv": self._f0,
            "N_conv": self._n,
            "asr_res": self._asr_res,
            "encode (and its input's join)": [self._encode_in, self._encode],
        }
        for i, (join, block) in enumerate(self._decode):
            parts[f"decode.{i} (and its input's join)"] = [join, block]
        parts["generator source held back"] = self._harmonics
        parts["generator source STFT"] = self._source
        for i, stage in enumerate(self._stages):
            parts[f"generator stage {i}: ups"] = stage.upsampled
            parts[f"generator stage {i}: source STFT held back"] = stage.source
            parts[f"generator stage {i}: noise conv and res"] = stage.noise
            parts[f"generator stage {i}: x + source (delay line)"] = stage.add
            parts[f"generator stage {i}: resblocks"] = stage.mix
        parts["conv_post and iSTFT"] = self._post
        return {
            name: sum(s.state_bytes() for s in (v if isinstance(v, list) else [v]))
            for name, v in parts.items()
        }
