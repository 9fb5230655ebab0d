"""Kokoro's decoder streamed with cached state (`model_server.engines.streaming_decoder`), on
the small random checkpoint (tests/support/kokoro_checkpoint.py) loaded by kokoro's KModel:
with the whole call's norm statistics (the oracle, recorded around that call) the audio pushed
out window by window, at any window size, is the whole call's; it trails the frames by a fixed
lookahead; a stream dropped between windows leaves nothing behind."""

from __future__ import annotations

import copy
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from model_server.engines.streaming_decoder import StreamingDecoder, recording_statistics
from tests.support.kokoro_checkpoint import SAMPLES_PER_FRAME, write_checkpoint

torch = pytest.importorskip("torch", reason="the torch extra is part of `make setup`")

# the checkpoint's decoder has Kokoro's full width: seconds a test on a 2-core CPU (the file
# about half a minute), so `make test-quick` leaves it out
pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """One intra-op thread: the tensors are small, and two threads spin against whatever else
    the machine runs (a loaded 2-core machine made these tests 10x slower)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


FRAMES = 32
# as tests/model_server/engines/test_torch_engine.py: a CUDA device when the GPU check asks for
# one, else the CPU
DEVICE = os.environ.get("KOKORO_TEST_DEVICE", "cpu")


@dataclass(frozen=True)
class Segment:
    """A decoder, one segment's inputs, and its whole call: the audio, the harmonic source the
    call drew, each norm's statistics."""

    decoder: Any
    asr: Any
    f0: Any
    n: Any
    style: Any
    harmonics: Any
    audio: Any
    statistics: Any

    @property
    def frames(self) -> int:
        return int(self.asr.shape[-1])

    def stream(self, sizes: Sequence[int], decoder: StreamingDecoder | None = None) -> list[Any]:
        """The audio of each push, windows of `sizes` frames (cycled), then the flush's."""
        decoder = decoder or StreamingDecoder(self.decoder, self.style, self.statistics)
        outs, start, k = [], 0, 0
        while start < self.frames:
            end = min(self.frames, start + sizes[k % len(sizes)])
            outs.append(
                decoder.push(
                    self.asr[..., start:end],
                    self.f0[:, 2 * start : 2 * end],
                    self.n[:, 2 * start : 2 * end],
                    self.harmonics[:, start * SAMPLES_PER_FRAME : end * SAMPLES_PER_FRAME],
                )
            )
            start, k = end, k + 1
        return [*outs, decoder.flush()]


@pytest.fixture(scope="module")
def decoder(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The checkpoint's decoder, loaded by KModel (its weight-normed weights from the file)."""
    from kokoro import KModel

    directory: Path = tmp_path_factory.mktemp("kokoro-tiny")
    write_checkpoint(directory)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*weight_norm.* is deprecated", FutureWarning)
        model = KModel(
            repo_id="hexgrad/Kokoro-82M",
            config=str(directory / "config.json"),
            model=str(directory / "kokoro-v1_0.pth"),
        ).eval()
    return model.decoder.to(DEVICE)


def whole_call(decoder: Any, dtype: Any = None, frames: int = FRAMES) -> Segment:
    """One segment's inputs (random features, an F0 curve with an unvoiced stretch) and the
    whole call of `decoder` over them, in `dtype` (None: the decoder's own)."""
    generator = torch.Generator().manual_seed(1)
    asr = torch.randn(1, 512, frames, generator=generator)
    f0 = 140 + 3 * torch.randn(1, 2 * frames, generator=generator).cumsum(-1)
    f0[:, 20:28] = 0  # an unvoiced stretch
    n = torch.randn(1, 2 * frames, generator=generator)
    style = 0.1 * torch.randn(1, 128, generator=generator)
    dtype = dtype or next(decoder.parameters()).dtype
    asr, f0, n, style = (t.to(DEVICE, dtype) for t in (asr, f0, n, style))
    drawn: list[Any] = []
    hook = decoder.generator.m_source.register_forward_hook(
        lambda _m, _i, out: drawn.append(out[0].transpose(1, 2).squeeze(1))
    )
    torch.manual_seed(3)
    try:
        with torch.inference_mode(), recording_statistics(decoder) as statistics:
            audio = decoder(asr, f0, n, style)
    finally:
        hook.remove()
    return Segment(decoder, asr, f0, n, style, drawn[0], audio, statistics)


@pytest.fixture(scope="module")
def segment(decoder: Any) -> Segment:
    return whole_call(decoder)


def snr_db(reference: Any, other: Any) -> float:
    error = (other - reference).double().pow(2).sum().item()
    return 10 * math.log10(reference.double().pow(2).sum().item() / max(error, 1e-300))


def test_the_oracle_has_every_norm_of_the_decoder(segment: Segment) -> None:
    norms = [m for m in segment.decoder.modules() if isinstance(m, torch.nn.InstanceNorm1d)]
    assert len(segment.statistics) == len(norms) == 34  # 10 in the body, 24 in the generator
    assert segment.audio.shape == (1, 1, FRAMES * SAMPLES_PER_FRAME)


@pytest.mark.parametrize("sizes", [[8], [16], [24], [3, 1, 5]])
def test_streamed_with_the_oracle_norms_is_the_whole_call(
    segment: Segment, sizes: list[int]
) -> None:
    audio = torch.cat(segment.stream(sizes), dim=-1)
    assert audio.shape == segment.audio.shape
    assert snr_db(segment.audio, audio) >= 80.0


@pytest.mark.skipif(DEVICE != "cpu", reason="oneDNN's int8 convolutions are the CPU's")
def test_with_int8_convolutions_the_stream_is_close_to_the_whole_call_and_follows_its_blocks(
    segment: Segment,
) -> None:
    """The residual blocks' convolutions in int8 (`int8.Int8Convs`, as the onnx engine streams
    on a CPU): each quantises what a push gives it, so the same blocks give the same bytes and
    the audio is the whole float call's to 8 bits' precision."""
    from model_server.engines import int8

    if not int8.available():
        pytest.skip("this torch has no oneDNN")
    kernels = int8.Int8Convs().kernel

    def streamed(sizes: list[int]) -> Any:
        decoder = StreamingDecoder(
            segment.decoder, segment.style, segment.statistics, kernels=kernels
        )
        return torch.cat(segment.stream(sizes, decoder), dim=-1)

    audio = streamed([16])
    assert audio.shape == segment.audio.shape
    assert torch.equal(audio, streamed([16]))
    assert not torch.equal(audio, torch.cat(segment.stream([16]), dim=-1))  # not float's
    assert snr_db(segment.audio, audio) >= 20.0  # measured 31 dB


def test_a_segment_shorter_than_the_lookahead_comes_out_whole_at_the_flush(decoder: Any) -> None:
    # 5 frames: over 2 or 3 frames some channels' variance is far below the norms' epsilon, and
    # fixed statistics pass on what the whole call's own cancel (float32 rounding, amplified):
    # -6 dB at 2 frames, 80 dB at 3 (float64: 173 and 246 dB); from 5 frames on ~120 dB
    segment = whole_call(decoder, frames=5)
    outs = segment.stream([1])
    assert [o.shape[-1] for o in outs[:-1]] == [0] * 5
    assert snr_db(segment.audio, outs[-1]) >= 80.0


def test_the_audio_trails_the_frames_by_a_fixed_lookahead(segment: Segment) -> None:
    outs = segment.stream([1])
    behind = [
        (k + 1) * SAMPLES_PER_FRAME - sum(o.shape[-1] for o in outs[: k + 1]) for k in range(FRAMES)
    ]
    # nothing for the first frames; then one frame of audio per frame pushed, a fixed number
    # of samples behind: the decoder's right lookahead (about 10.5 frames with one resblock
    # kernel per stage, 13.3 with Kokoro-82M's three)
    lookahead = behind[-1]
    assert 10 * SAMPLES_PER_FRAME < lookahead < 14 * SAMPLES_PER_FRAME
    first = lookahead // SAMPLES_PER_FRAME + 1
    assert behind[first:] == [lookahead] * (FRAMES - first)
    assert outs[-1].shape[-1] == lookahead  # the flush gives the rest


def test_given_the_bodys_output_the_generator_streams_alone_a_shorter_lookahead_behind(
    segment: Segment,
) -> None:
    """`push_generator`: the body's output of the whole segment (as the onnx engine's stream
    has it from the body's whole pass) pushed into the generator frame by frame is the whole
    call, and the audio trails the frames by the generator's lookahead alone."""
    from model_server.engines.streamed import decode_body

    with torch.inference_mode():
        body = decode_body(segment.decoder, segment.asr, segment.f0, segment.n, segment.style)
    assert body.shape[-1] == 2 * FRAMES
    decoder = StreamingDecoder(segment.decoder, segment.style, segment.statistics)
    outs = [
        decoder.push_generator(
            body[..., 2 * k : 2 * k + 2],
            segment.harmonics[:, k * SAMPLES_PER_FRAME : (k + 1) * SAMPLES_PER_FRAME],
        )
        for k in range(FRAMES)
    ]
    outs.append(decoder.flush())
    audio = torch.cat(outs, dim=-1)
    assert audio.shape == segment.audio.shape
    assert snr_db(segment.audio, audio) >= 80.0
    lookahead = FRAMES * SAMPLES_PER_FRAME - sum(o.shape[-1] for o in outs[:-1])
    # the whole decoder's is 10.5-14 frames (the test above); the generator's alone 2.6 here
    # (one resblock kernel a stage), 5.4 with Kokoro-82M's three
    # (tests/model_server/engines/test_streamed.py)
    assert 2 * SAMPLES_PER_FRAME < lookahead < 7 * SAMPLES_PER_FRAME
    assert outs[-1].shape[-1] == lookahead
    # one stream is pushed one way
    with pytest.raises(RuntimeError, match="the whole decoder's inputs or the generator's"):
        decoder.push(segment.asr[..., :1], segment.f0[:, :2], segment.n[:, :2], body[..., :0])


def test_the_state_carried_is_the_layers_caches_and_delay_lines(segment: Segment) -> None:
    decoder = StreamingDecoder(segment.decoder, segment.style, segment.statistics)
    segment.stream([4], decoder)  # flushed: nothing left
    assert sum(decoder.state_bytes().values()) == 0
    decoder = StreamingDecoder(segment.decoder, segment.style, segment.statistics)
    decoder.push(
        segment.asr[..., :16],
        segment.f0[:, :32],
        segment.n[:, :32],
        segment.harmonics[:, : 16 * SAMPLES_PER_FRAME],
    )
    held = decoder.state_bytes()
    assert held["F0_conv"] == 4  # (kernel 3 - stride 2) one float of the F0 curve
    caches = ("encode", "decode", "ups", "noise", "resblocks", "iSTFT")  # the convolutions'
    assert all(size > 0 for name, size in held.items() if any(c in name for c in caches)), held
    # the rest may be empty: a 1x1 convolution keeps nothing, a join's branches may be level


def test_a_stream_dropped_between_windows_leaves_nothing_behind(segment: Segment) -> None:
    first = StreamingDecoder(segment.decoder, segment.style, segment.statistics)
    first.push(segment.asr[..., :5], segment.f0[:, :10], segment.n[:, :10], segment.harmonics)
    del first  # cancelled: the decoder's modules hold no stream state
    assert snr_db(segment.audio, torch.cat(segment.stream([FRAMES]), dim=-1)) >= 80.0


def test_a_norm_without_statistics_is_refused(segment: Segment) -> None:
    partial = {k: v for k, v in segment.statistics.items() if not k.startswith("generator")}
    with pytest.raises(KeyError, match="generator"):
        StreamingDecoder(segment.decoder, segment.style, partial)


def test_in_float64_the_stream_is_the_whole_call_to_its_precision(decoder: Any) -> None:
    """Exact, not close: the same decoder in float64 (its STFT's window too), streamed in
    windows of 7 frames, is the whole call to float64's rounding."""
    wide = copy.deepcopy(decoder).double()
    wide.generator.stft.window = wide.generator.stft.window.double()
    segment = whole_call(wide, torch.float64)
    audio = torch.cat(segment.stream([7]), dim=-1)
    assert audio.dtype == torch.float64
    torch.testing.assert_close(audio, segment.audio, rtol=0, atol=1e-12)


def _scaled(statistics: Any, name_starts: str, factor: float) -> Any:
    """`statistics` with the norms under `name_starts` given `factor` x their variance and a
    shifted mean: other statistics, which change the audio."""
    return {
        k: ((m + 0.5, v * factor) if k.startswith(name_starts) else (m, v))
        for k, (m, v) in statistics.items()
    }


def test_statistics_set_between_pushes_are_the_next_pushes_and_only_theirs(
    segment: Segment,
) -> None:
    other = _scaled(segment.statistics, "generator.", 4.0)
    fixed = segment.stream([8])  # the oracle throughout
    given = segment.stream([8], StreamingDecoder(segment.decoder, segment.style, other))
    # set before any push: the same stream as built with them, bit for bit
    before = StreamingDecoder(segment.decoder, segment.style, segment.statistics)
    before.set_statistics(other)
    assert before.statistics is other
    for a, b in zip(segment.stream([8], before), given, strict=True):
        assert torch.equal(a, b)

    # set after the second push: the pushes before keep the oracle's audio, bit for bit, and
    # from the third push on the generator's frames are normalised by the new statistics
    before_third = 0
    inputs: list[tuple[str, Any]] = []
    switched = StreamingDecoder(
        segment.decoder,
        segment.style,
        segment.statistics,
        observe=lambda name, x: inputs.append((name, x.clone())),
    )
    outs = []
    for k, start in enumerate(range(0, FRAMES, 8)):
        if k == 2:
            switched.set_statistics(other)
            assert switched.statistics is other
            before_third = len(inputs)
        end = start + 8
        outs.append(
            switched.push(
                segment.asr[..., start:end],
                segment.f0[:, 2 * start : 2 * end],
                segment.n[:, 2 * start : 2 * end],
                segment.harmonics[:, start * SAMPLES_PER_FRAME : end * SAMPLES_PER_FRAME],
            )
        )
    outs.append(switched.flush())
    assert outs[1].shape[-1] > 0  # (the second push gave audio)
    for k in range(2):
        assert torch.equal(outs[k], fixed[k])
    assert all(not torch.equal(a, b) for a, b in zip(outs[2:], fixed[2:], strict=True))
    # and what the norms saw before the switch is what they see under the oracle alone
    fixed_inputs: list[tuple[str, Any]] = []
    segment.stream(
        [8],
        StreamingDecoder(
            segment.decoder,
            segment.style,
            segment.statistics,
            observe=lambda name, x: fixed_inputs.append((name, x.clone())),
        ),
    )
    for (name, x), (fixed_name, y) in zip(inputs[:before_third], fixed_inputs, strict=False):
        assert name == fixed_name
        assert torch.equal(x, y)


def test_statistics_without_every_norm_are_refused_and_change_nothing(segment: Segment) -> None:
    decoder = StreamingDecoder(segment.decoder, segment.style, segment.statistics)
    partial = {k: v for k, v in segment.statistics.items() if not k.startswith("generator")}
    with pytest.raises(KeyError, match="generator"):
        decoder.set_statistics(partial)
    assert decoder.statistics is segment.statistics
    assert snr_db(segment.audio, torch.cat(segment.stream([8], decoder), dim=-1)) >= 80.0


def test_the_observer_is_told_every_norms_input_over_the_segment(segment: Segment) -> None:
    """With the oracle's statistics the norms' inputs, told push by push, are the whole call's:
    their means over the segment are the oracle's."""
    sums: dict[str, Any] = {}
    steps: dict[str, int] = {}

    def observe(name: str, x: Any) -> None:
        sums[name] = sums.get(name, 0) + x.double().sum(-1, keepdim=True)
        steps[name] = steps.get(name, 0) + x.shape[-1]

    decoder = StreamingDecoder(segment.decoder, segment.style, segment.statistics, observe=observe)
    segment.stream([5], decoder)
    assert sums.keys() == segment.statistics.keys()
    for name, (mean, _var) in segment.statistics.items():
        torch.testing.assert_close(sums[name] / steps[name], mean, rtol=0, atol=1e-4)


def test_statistics_set_by_the_observer_apply_to_the_input_it_was_told(segment: Segment) -> None:
    """The observer is told a norm's input before the norm normalises it: statistics it sets
    then (a rule counting each push's own frames) already normalise that input."""
    other = _scaled(segment.statistics, "", 4.0)
    given = segment.stream([8], StreamingDecoder(segment.decoder, segment.style, other))
    told: list[str] = []
    streams: list[StreamingDecoder] = []

    def observe(name: str, _x: Any) -> None:
        if not told:  # the first norm of the first push
            streams[0].set_statistics(other)
        told.append(name)

    streams.append(
        StreamingDecoder(segment.decoder, segment.style, segment.statistics, observe=observe)
    )
    for a, b in zip(segment.stream([8], streams[0]), given, strict=True):
        assert torch.equal(a, b)
    assert told[0] == "encode.norm1.norm"
