"""Cached-state streaming layers: a convolutional stack run window after window, exactly.

A window of a decoder that is decoded as a short utterance of its own, with some context on each
side, is only an approximation of the whole call. These layers carry state instead, as exact
streaming vocoders do: each keeps what the whole call would have read from the inputs before the
window (a convolution the last `(kernel - 1) x dilation` of its inputs, a transposed convolution
and an overlap-add the tail its next input overlaps) and emits only the outputs its inputs so far
determine. Pushing the input in windows of any size (1..N samples, empty ones too), then
flushing, gives the whole call's output, sample for sample up to the order of float additions;
each output comes out as soon as the last input it reads has been pushed, so a stack's output is
delayed by its right lookahead, which nothing needs to state: it follows from the layers.

Every stream has the shape of an incremental codec (`push(x) -> y`, `flush() -> y`, see
DESIGN.md §6) over tensors of shape (batch, channels, time), time last:

- `Pad`: zeros or reflection at either end (the left one as the first samples arrive, the
  right one at `flush`; a left reflection of `p` waits for `p + 1` samples);
- `Conv1d`: a valid convolution, any stride, dilation and groups (its padding is a `Pad`
  before it: `conv1d(module)` builds both from an `nn.Conv1d`);
- `ConvTranspose1d`: its overlapping tail carried, its padding cropped at both ends (the right
  end held back only where the crop is longer than the tail);
- `stft()` (a reflection `Pad`, then `Frames`) and `ISTFT`: `torch.stft`/`torch.istft` with
  `center=True` (reflect-padded frames; an overlap-add, `overlap_add()`, divided by the
  window's own overlap-add, both cropped);
- `Pointwise`: anything that acts on each time step alone (activations, fixed-statistics
  norms, nearest upsampling), stateless;
- `Join`: several inputs combined time step by time step (a sum, a concatenation); what one
  input is ahead of the others waits in it. This is the delay line where the branches of a
  residual block, or the inputs of a concatenation, have different latencies;
- `Seq` and `Parallel` (branches from one input, then a `Join`) compose them.

`state_bytes()` says what a stream holds between pushes (its caches and delay lines). Dropping a
stream object is cancelling it: nothing else holds its state. Each class names its state
(`STATE`: the attributes a push changes) and the streams it is made of (`PARTS`), so that the
streams of several sessions can be pushed as one batch (`stream_batch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Stream(Protocol):
    """A layer over time, streamed: `push` some time steps, get the outputs they determine;
    `flush` when the input is over, get the rest. At least one `push` (possibly of zero time
    steps: it gives the batch, channels, dtype and device) comes before `flush`."""

    def push(self, x: Tensor) -> Tensor: ...

    def flush(self) -> Tensor: ...

    def state_bytes(self) -> int: ...


def _nbytes(t: Tensor | None) -> int:
    return 0 if t is None else int(t.numel() * t.element_size())


def _empty_like(t: Tensor, channels: int | None = None) -> Tensor:
    """Zero time steps of the shape of `t` (with `channels`, when given)."""
    shape = list(t.shape)
    shape[-1] = 0
    if channels is not None:
        shape[-2] = channels
    return t.new_zeros(shape)


def _cat(a: Tensor | None, b: Tensor) -> Tensor:
    if a is None or a.shape[-1] == 0:
        return b
    if b.shape[-1] == 0:
        return a
    return torch.cat([a, b], dim=-1)


def effective_weight(module: nn.Module) -> Tensor:
    """The weight a convolution computes with: through `weight_norm` (the old hook or the
    parametrization) where there is one, else its own."""
    for hook in module._forward_pre_hooks.values():
        compute = getattr(hook, "compute_weight", None)
        if compute is not None and getattr(hook, "name", None) == "weight":
            return compute(module)
    return module.weight


class Pad:
    """Padding at both ends of the time axis: `"zeros"` or `"reflect"` (as `F.pad` does,
    the edge sample not repeated). The left padding comes with the first samples (a reflection
    of `left` needs `left + 1` of them, so it holds them back until then); the right one at
    `flush` (a reflection from a copy of the last `right + 1` samples: no delay)."""

    STATE = ("_started", "_head", "_tail", "_like")

    def __init__(self, left: int, right: int, mode: str = "zeros") -> None:
        if left < 0 or right < 0:
            raise ValueError("padding is not negative")
        if mode not in ("zeros", "reflect"):
            raise ValueError(f"padding mode {mode!r}: zeros or reflect")
        self.left, self.right, self.mode = left, right, mode
        self._started = False
        self._head: Tensor | None = None  # samples held until a left reflection can be made
        self._tail: Tensor | None = None  # the last right + 1 samples, for a right reflection
        self._like: Tensor | None = None

    def push(self, x: Tensor) -> Tensor:
        self._like = _empty_like(x)
        if self.mode == "reflect" and self.right:
            self._tail = _cat(self._tail, x)[..., -(self.right + 1) :]
        if self._started:
            return x
        if self.mode == "zeros":
            self._started = True
            return _cat(x.new_zeros((*x.shape[:-1], self.left)), x)
        head = _cat(self._head, x)
        if head.shape[-1] <= self.left:
            self._head = head
            return _empty_like(x)
        self._head, self._started = None, True
        return torch.cat([head[..., 1 : self.left + 1].flip(-1), head], dim=-1)

    def flush(self) -> Tensor:
        if self._like is None:
            raise RuntimeError("flush before any push")
        if self.mode == "zeros":  # started by the first push
            return self._like.new_zeros((*self._like.shape[:-1], self.right))
        if not self._started:
            raise ValueError(f"a reflection of {self.left} needs more than {self.left} steps")
        tail, self._tail = self._tail, None
        if not self.right:
            return self._like
        if tail is None or tail.shape[-1] <= self.right:
            raise ValueError(f"a reflection of {self.right} needs more than {self.right} steps")
        return tail[..., :-1].flip(-1)

    def state_bytes(self) -> int:
        return _nbytes(self._head) + _nbytes(self._tail)


class Conv1d:
    """A valid (unpadded) 1-d convolution, any stride, dilation and groups: keeps the inputs
    its next output still reads (`(kernel - 1) x dilation` of them at stride 1)."""

    STATE = ("_pending",)

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        kernel: Callable[[Tensor], Tensor] | None = None,
        rows: bool = False,
    ) -> None:
        self.weight, self.bias = weight, bias
        self.stride, self.dilation, self.groups = stride, dilation, groups
        self.rows = rows  # a batch computed row by row (`row_by_row`)
        self.span = dilation * (weight.shape[-1] - 1) + 1
        self._pending: Tensor | None = None
        # the valid convolution of the inputs given, when not `F.conv1d` with this weight
        # (e.g. `int8.Int8Conv`, computing with the same weight in int8)
        self._kernel = kernel

    def push(self, x: Tensor) -> Tensor:
        buffer = _cat(self._pending, x)
        self._pending = buffer
        length = buffer.shape[-1]
        if length < self.span:
            return _empty_like(buffer, self.weight.shape[0])
        count = (length - self.span) // self.stride + 1
        used = buffer[..., : (count - 1) * self.stride + self.span]
        self._pending = buffer[..., count * self.stride :]
        if self._kernel is not None:
            return self._kernel(used)
        return row_by_row(self._float, self.rows)(used)

    def _float(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)

    def flush(self) -> Tensor:
        if self._pending is None:
            raise RuntimeError("flush before any push")
        out = _empty_like(self._pending, self.weight.shape[0])
        self._pending = None  # what is left reads past the end: no output of the whole call
        return out

    def state_bytes(self) -> int:
        return _nbytes(self._pending)


class ConvTranspose1d:
    """A 1-d transposed convolution (dilation 1, kernel at least its stride): each input step
    adds `kernel` outputs from `stride` x its index on, so after `n` steps the first
    `n x stride` outputs are final and the next `kernel - stride` are a partial sum, carried.
    `padding` is cropped from the start, `padding - output_padding` from the end (where that
    is longer than the carried tail, the difference is held back; a negative one is the bias
    appended, as `output_padding` gives)."""

    STATE = ("_skip", "_tail", "_held", "_like")

    def __init__(
        self,
        weight: Tensor,
        bias: Tensor | None,
        stride: int = 1,
        padding: int = 0,
        output_padding: int = 0,
        groups: int = 1,
        rows: bool = False,
    ) -> None:
        kernel = weight.shape[-1]
        if kernel < stride:
            raise ValueError(f"a kernel of {kernel} shorter than its stride {stride}")
        self.weight, self.bias = weight, bias
        self.stride, self.groups = stride, groups
        self.rows = rows  # a batch computed row by row (`row_by_row`)
        self.overlap = kernel - stride
        self.out_channels = weight.shape[1] * groups
        self.right_crop = padding - output_padding
        self.hold = max(0, self.right_crop - self.overlap)
        self._skip = padding  # outputs still to drop from the start
        self._tail: Tensor | None = None  # the partial sums, without bias
        self._held: Tensor | None = None  # final outputs the right crop may still drop
        self._like: Tensor | None = None

    def _biased(self, z: Tensor) -> Tensor:
        return z if self.bias is None else z + self.bias.view(1, -1, 1)

    def _drop_start(self, out: Tensor) -> Tensor:
        """`out` less what is still to be cropped from the start."""
        if self._skip:
            dropped = min(self._skip, out.shape[-1])
            out, self._skip = out[..., dropped:], self._skip - dropped
        return out

    def _emit(self, out: Tensor) -> Tensor:
        out = self._drop_start(out)
        if not self.hold:
            return out
        out = _cat(self._held, out)
        cut = max(0, out.shape[-1] - self.hold)
        self._held = out[..., cut:]
        return out[..., :cut]

    def push(self, x: Tensor) -> Tensor:
        steps = x.shape[-1]
        if self._like is None:
            self._like = _empty_like(x, self.out_channels)
        if steps == 0:
            return self._like
        z = row_by_row(self._float, self.rows)(x)
        if self._tail is not None and self.overlap:
            z = torch.cat([z[..., : self.overlap] + self._tail, z[..., self.overlap :]], dim=-1)
        self._tail = z[..., steps * self.stride :]
        return self._emit(self._biased(z[..., : steps * self.stride]))

    def _float(self, x: Tensor) -> Tensor:
        return F.conv_transpose1d(x, self.weight, None, self.stride, 0, 0, self.groups)

    def flush(self) -> Tensor:
        if self._like is None:
            raise RuntimeError("flush before any push")
        if self._tail is None:  # no input: no output
            return self._like
        last = self._biased(self._tail)
        if self.right_crop < 0:
            last = torch.cat(
                [last, self._biased(last.new_zeros((*last.shape[:-1], -self.right_crop)))], -1
            )
        out = _cat(self._held, self._drop_start(last))
        self._tail = self._held = None
        if self.right_crop > 0:
            out = out[..., : max(0, out.shape[-1] - self.right_crop)]
        return out

    def state_bytes(self) -> int:
        return _nbytes(self._tail) + _nbytes(self._held)


class Pointwise:
    """`fn` applied to each time step alone (an activation, a norm with fixed statistics,
    nearest upsampling): no state, no delay."""

    STATE = ("_like",)

    def __init__(self, fn: Callable[[Tensor], Tensor]) -> None:
        self.fn = fn
        self._like: Tensor | None = None

    def push(self, x: Tensor) -> Tensor:
        y = self.fn(x)
        self._like = _empty_like(y)
        return y

    def flush(self) -> Tensor:
        if self._like is None:
            raise RuntimeError("flush before any push")
        return self._like

    def state_bytes(self) -> int:
        return 0


def identity() -> Pointwise:
    return Pointwise(lambda x: x)


class Join:
    """`fn` over several inputs, time step by time step: each `push` gives each input's next
    steps (any number, empty too); the steps all inputs have reached are combined and emitted,
    the rest of an input that is ahead waits (a delay line as long as the latencies differ)."""

    STATE = ("_pending",)

    def __init__(self, fn: Callable[..., Tensor], inputs: int) -> None:
        self.fn, self.inputs = fn, inputs
        self._pending: list[Tensor | None] = [None] * inputs

    def push(self, *xs: Tensor) -> Tensor:
        if len(xs) != self.inputs:
            raise ValueError(f"{len(xs)} inputs to a join of {self.inputs}")
        joined = [_cat(p, x) for p, x in zip(self._pending, xs, strict=True)]
        ready = min(t.shape[-1] for t in joined)
        self._pending = [t[..., ready:] for t in joined]
        return self.fn(*(t[..., :ready] for t in joined))

    def flush(self) -> Tensor:
        left = [t.shape[-1] for t in self._pending if t is not None]
        if len(left) != self.inputs:
            raise RuntimeError("flush before every input was pushed")
        if any(left):
            raise RuntimeError(f"inputs of different lengths joined: {left} steps left over")
        return self.fn(*self._pending)

    def state_bytes(self) -> int:
        return sum(_nbytes(t) for t in self._pending)


class Seq:
    """Streams one after another."""

    PARTS = ("layers",)

    def __init__(self, *layers: Stream) -> None:
        self.layers = layers

    def push(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer.push(x)
        return x

    def flush(self) -> Tensor:
        out: Tensor | None = None
        for layer in self.layers:
            out = layer.flush() if out is None else _cat(layer.push(out), layer.flush())
        if out is None:
            raise RuntimeError("an empty sequence")
        return out

    def state_bytes(self) -> int:
        return sum(layer.state_bytes() for layer in self.layers)


class Parallel:
    """Branches from one input, joined by `fn` (a residual block: `Parallel([body,
    identity()], lambda y, x: y + x)`)."""

    PARTS = ("branches", "join")

    def __init__(self, branches: Sequence[Stream], fn: Callable[..., Tensor]) -> None:
        self.branches = tuple(branches)
        self.join = Join(fn, len(self.branches))

    def push(self, x: Tensor) -> Tensor:
        return self.join.push(*(b.push(x) for b in self.branches))

    def flush(self) -> Tensor:
        return _cat(self.join.push(*(b.flush() for b in self.branches)), self.join.flush())

    def state_bytes(self) -> int:
        return sum(b.state_bytes() for b in self.branches) + self.join.state_bytes()


def row_by_row(fn: Callable[[Tensor], Tensor], rows: bool = True) -> Callable[[Tensor], Tensor]:
    """`fn` over a batch, one row at a time when `rows` (else `fn` itself). oneDNN chooses a
    float convolution's algorithm, and so the order of its sums, by the whole input's shape, the
    batch included: computed row by row, a row batched with others gets the bytes it gets
    alone (where a quantised layer after it would turn a difference in the last bit into a
    different rounding: `stream_batch`)."""
    if not rows:
        return fn

    def each(x: Tensor) -> Tensor:
        return fn(x) if x.shape[0] == 1 else torch.cat([fn(row) for row in x.split(1)])

    return each


def conv1d(
    module: nn.Conv1d, kernel: Callable[[Tensor], Tensor] | None = None, rows: bool = False
) -> Seq:
    """An `nn.Conv1d` (zero padding, any stride, dilation, groups; weight-normed or not),
    streamed: its padding, then the valid convolution, with its own weight and bias (computed
    by `kernel` when one is given, else in float, row by row when `rows`: `Conv1d`)."""
    if module.padding_mode != "zeros":
        raise ValueError(f"padding mode {module.padding_mode!r}")
    if isinstance(module.padding, str):
        raise ValueError(f"padding {module.padding!r}: give it in steps")
    (pad,) = module.padding
    conv = Conv1d(
        effective_weight(module),
        module.bias,
        module.stride[0],
        module.dilation[0],
        module.groups,
        kernel,
        rows,
    )
    return Seq(Pad(pad, pad), conv)


def conv_transpose1d(module: nn.ConvTranspose1d, rows: bool = False) -> ConvTranspose1d:
    """An `nn.ConvTranspose1d` (dilation 1; weight-normed or not), streamed (a batch row by
    row when `rows`)."""
    if module.dilation[0] != 1:
        raise ValueError("a dilated transposed convolution")
    return ConvTranspose1d(
        effective_weight(module),
        module.bias,
        module.stride[0],
        module.padding[0],
        module.output_padding[0],
        module.groups,
        rows,
    )


class Frames:
    """`torch.stft` without centring (`center=False`) over the samples pushed so far: a frame
    of `n_fft` every `hop` samples, as a complex (batch, bins, frames) tensor; keeps the
    samples its next frame reads. Input (batch, 1, samples)."""

    STATE = ("_pending",)

    def __init__(self, n_fft: int, hop: int, window: Tensor) -> None:
        self.n_fft, self.hop, self.window = n_fft, hop, window
        self._pending: Tensor | None = None

    def _transform(self, samples: Tensor) -> Tensor:
        return torch.stft(
            samples[:, 0, :],
            self.n_fft,
            self.hop,
            self.n_fft,
            window=self.window.to(samples.device),
            center=False,
            return_complex=True,
        )

    def push(self, x: Tensor) -> Tensor:
        buffer = _cat(self._pending, x)
        self._pending = buffer
        length = buffer.shape[-1]
        if length < self.n_fft:
            return self._empty(buffer)
        count = (length - self.n_fft) // self.hop + 1
        self._pending = buffer[..., count * self.hop :]
        return self._transform(buffer[..., : (count - 1) * self.hop + self.n_fft])

    def _empty(self, like: Tensor) -> Tensor:
        dtype = torch.complex128 if like.dtype == torch.float64 else torch.complex64
        return torch.zeros((like.shape[0], self.n_fft // 2 + 1, 0), dtype=dtype, device=like.device)

    def flush(self) -> Tensor:
        if self._pending is None:
            raise RuntimeError("flush before any push")
        out = self._empty(self._pending)
        self._pending = None
        return out

    def state_bytes(self) -> int:
        return _nbytes(self._pending)


def stft(n_fft: int, hop: int, window: Tensor) -> Seq:
    """`torch.stft(x, n_fft, hop, n_fft, window, center=True, pad_mode="reflect",
    return_complex=True)`, streamed: samples (batch, 1, n) in, complex frames out."""
    return Seq(Pad(n_fft // 2, n_fft // 2, "reflect"), Frames(n_fft, hop, window))


def overlap_add(frame: int, hop: int, crop: int, like: Tensor) -> ConvTranspose1d:
    """Frames (batch, `frame`, count) added `hop` apart into (batch, 1, samples), `crop`
    samples cropped from each end: a transposed convolution by the identity."""
    eye = torch.eye(frame, dtype=like.dtype, device=like.device).unsqueeze(1)
    return ConvTranspose1d(eye, None, hop, crop)


class ISTFT:
    """`torch.istft(spec, n_fft, hop, n_fft, window, center=True)` (no `length`), streamed:
    complex frames (batch, bins, count) in, samples (batch, 1, hop x (count - 1)) out. Each
    frame's inverse FFT times the window, overlap-added; the window's square overlap-added
    beside it (the divisor: constant inside, not at the ends), both cropped `n_fft // 2` at
    each end, then divided."""

    PARTS = ("_signal", "_envelope", "_divide")

    def __init__(self, n_fft: int, hop: int, window: Tensor) -> None:
        self.n_fft, self.hop, self.window = n_fft, hop, window
        self._signal: ConvTranspose1d | None = None
        self._envelope: ConvTranspose1d | None = None
        self._divide = Join(torch.div, 2)

    def push(self, spec: Tensor) -> Tensor:
        frames = torch.fft.irfft(spec, n=self.n_fft, dim=1)
        window = self.window.to(device=frames.device, dtype=frames.dtype).view(1, -1, 1)
        if self._signal is None or self._envelope is None:
            crop = self.n_fft // 2
            self._signal = overlap_add(self.n_fft, self.hop, crop, frames)
            self._envelope = overlap_add(self.n_fft, self.hop, crop, frames)
        squares = (window * window).expand(frames.shape[0], -1, frames.shape[-1])
        return self._divide.push(self._signal.push(frames * window), self._envelope.push(squares))

    def flush(self) -> Tensor:
        if self._signal is None or self._envelope is None:
            raise RuntimeError("flush before any push")
        out = self._divide.push(self._signal.flush(), self._envelope.flush())
        return _cat(out, self._divide.flush())

    def state_bytes(self) -> int:
        own = self._divide.state_bytes()
        if self._signal is not None and self._envelope is not None:
            own += self._signal.state_bytes() + self._envelope.state_bytes()
        return own


def run_in_windows(stream: Stream, x: Tensor, sizes: Sequence[int]) -> Tensor:
    """`x` pushed through `stream` in windows of `sizes` steps (cycled; a size of 0 pushes
    nothing), then flushed: the output joined."""
    if not sizes or max(sizes) <= 0:
        raise ValueError("window sizes with one above 0")
    outs: list[Tensor] = []
    start, k = 0, 0
    length = x.shape[-1]
    while start < length or k == 0:
        size = sizes[k % len(sizes)]
        outs.append(stream.push(x[..., start : start + size]))
        start, k = start + size, k + 1
    outs.append(stream.flush())
    return torch.cat(outs, dim=-1)
