"""The onnx engine's streamed decoder (`engines/streamed.py`, `--decoder stream`):
the fixed blocks as a pure unit, then, on the real Kokoro-82M weights, what makes it exact: a
segment's samples are the same whatever windows ask for them (bit for bit), the same request
gives the same bytes through the synthesizer under two schedules, with the whole call's
statistics the stream is the whole call, its own are the body's exact and the voice's prior for
the generator, cancelling stops it between blocks, and the word timings read the front pass's
durations. (Its audio against one call, level, spectrum, DistillMOS and seams:
tests/model_server/test_progressive.py, both decoders.)"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from model_server.engines.base import SAMPLES_PER_FRAME, CancelToken
from model_server.engines.onnx import OnnxEngine
from model_server.engines.streamed import FIRST_BLOCKS, LATER_BLOCK, Inputs, blocks
from model_server.engines.streaming_decoder import Kernels, Statistics
from model_server.errors import SynthesisCancelled, SynthesisFailed
from model_server.windows import Window
from quality import closeness
from tests.model_server.engines.batched import batched_decodes

HELLO = "həlˈO ðˈɛɹ."
FOX = "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ nˌɪɹ ðə ɹˈɪvəɹ bˈæŋk."
VOICE = "jm_kumo"


# --- pure ------------------------------------------------------------------------------------


@pytest.mark.parametrize("frames", [1, 15, 16, 17, 64, 128, 129, 200, 431])
def test_blocks_tile_the_segment_on_a_fixed_ladder(frames: int) -> None:
    got = blocks(frames)
    assert got[0][0] == 0
    assert got[-1][1] == frames
    assert all(a[1] == b[0] for a, b in itertools.pairwise(got))
    ladder = [*FIRST_BLOCKS, *([LATER_BLOCK] * frames)]
    for (start, end), size in zip(got[:-1], ladder, strict=False):
        assert end - start == size  # every block but the last its ladder size
    assert 0 < got[-1][1] - got[-1][0] <= ladder[len(got) - 1]
    # the same frames, the same blocks: they depend on nothing else
    assert blocks(frames) == got


# --- the real weights ------------------------------------------------------------------------


@pytest.fixture
def engine(stream_engine: OnnxEngine) -> OnnxEngine:
    """The session's streamed-decoder engine (tests/conftest.py), loaded once."""
    return stream_engine


class WholeCalls:
    """A segment's whole torch call (`StreamedDecoder.whole`: its audio and every norm's
    statistics, the oracle) over its front pass's inputs, each computed once in the module: the
    front pass and the call are deterministic, and four tests here compare against FOX's."""

    def __init__(self, engine: OnnxEngine) -> None:
        self._engine = engine
        self._known: dict[str, tuple[Inputs, np.ndarray, Statistics]] = {}

    def __call__(self, phonemes: str) -> tuple[Inputs, np.ndarray, Statistics]:
        """`phonemes`' decoder inputs, its whole call's audio and the oracle."""
        if phonemes not in self._known:
            streamed = self._engine._streamed
            assert streamed is not None
            inputs = self._engine.front(phonemes, VOICE, 1.0, CancelToken()).features.inputs
            self._known[phonemes] = (inputs, *streamed.whole(inputs))
        return self._known[phonemes]


@pytest.fixture(scope="module")
def whole_calls(stream_engine: OnnxEngine) -> WholeCalls:
    return WholeCalls(stream_engine)


def _audio(engine: OnnxEngine, phonemes: str, sizes: list[int]) -> np.ndarray:
    """A segment's audio asked for in windows of `sizes` frames (the last as needed)."""
    front = engine.front(phonemes, VOICE, 1.0, CancelToken())
    pieces, start = [], 0
    for size in [*sizes, front.frames]:
        end = min(front.frames, start + size)
        pieces.append(engine.decode(front, Window(start, end, 0, 0), CancelToken()))
        start = end
        if start == front.frames:
            break
    return np.concatenate(pieces)


@pytest.mark.real_model
def test_a_segments_samples_do_not_depend_on_its_windows(engine: OnnxEngine) -> None:
    assert engine.exact_windows
    for phonemes in (HELLO, FOX):
        frames = engine.front(phonemes, VOICE, 1.0, CancelToken()).frames
        a = _audio(engine, phonemes, [24, 48, 96])
        b = _audio(engine, phonemes, [1, 7, 3, 100])
        c = _audio(engine, phonemes, [frames])
        assert a.size == frames * SAMPLES_PER_FRAME
        assert np.abs(a).max() > 0.1  # speech, not silence
        assert np.array_equal(a, b)
        assert np.array_equal(a, c)


@pytest.mark.real_model
async def test_the_same_request_under_two_schedules_gives_the_same_bytes(
    engine: OnnxEngine,
) -> None:
    """The synthesizer's windows follow the speed it measures and the schedule; the bytes do
    not."""
    from kokoro_contract.protocol import SynthesisRequest
    from model_server.scheduler import Scheduler
    from model_server.synthesis import Synthesizer
    from model_server.text.g2p import english_g2p
    from model_server.windows import EXACT_FIRST, Schedule

    g2p = english_g2p()
    text = "Your order shipped this morning. It arrives Friday."
    request = SynthesisRequest(text, VOICE, 1.0, "r")
    got = []
    # the default (an exact engine's: `EXACT_FIRST` frames first), the windows decoder's
    # ladder, and one of 40 frames
    for schedule in (None, Schedule(), Schedule(first=40, largest=40, smallest=40)):
        synthesizer = Synthesizer(engine, g2p, Scheduler(1), schedule=schedule)
        assert synthesizer.schedule.context == synthesizer.schedule.crossfade == 0
        if schedule is None:
            assert synthesizer.schedule.first == EXACT_FIRST
        try:
            chunks = [c async for c in synthesizer.stream(request, "k")]
        finally:
            synthesizer.close()
        got.append(chunks)
    assert len({tuple(len(c) for c in chunks) for chunks in got}) == 3  # other windows
    assert b"".join(got[0]) == b"".join(got[1]) == b"".join(got[2])


def _oracle_stream(
    engine: OnnxEngine, whole_calls: WholeCalls, kernels: Kernels | None
) -> tuple[np.ndarray, np.ndarray]:
    """FOX's whole torch call, and its segment streamed as the engine streams it (the body's
    whole pass, its output pushed into the generator in the segment's blocks) with that
    call's own statistics (the oracle), its resblocks' convolutions computed by `kernels`."""
    from model_server.engines.registry_decoder import GRAPH_GAIN
    from model_server.engines.streaming_decoder import StreamingDecoder

    streamed = engine._streamed
    assert streamed is not None
    x, whole, oracle = whole_calls(FOX)

    body, _ = streamed.body(x)

    def push() -> torch.Tensor:
        decoder = StreamingDecoder(streamed.decoder, x.style, oracle, kernels=kernels)
        pieces = [
            decoder.push_generator(
                body[..., 2 * a : 2 * b],
                x.harmonics[:, a * SAMPLES_PER_FRAME : b * SAMPLES_PER_FRAME],
            )
            for a, b in blocks(x.frames)
        ]
        return torch.cat([*pieces, decoder.flush()], dim=-1)

    stream = streamed.thread.run(push).numpy().ravel() * GRAPH_GAIN
    assert stream.size == whole.size == x.frames * SAMPLES_PER_FRAME
    return whole, stream


def _snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    error = np.sum((other.astype(np.float64) - reference) ** 2)
    return 10 * math.log10(np.sum(reference.astype(np.float64) ** 2) / error)


@pytest.mark.real_model
def test_with_the_whole_calls_statistics_the_stream_is_the_whole_call(
    engine: OnnxEngine, whole_calls: WholeCalls
) -> None:
    """The only approximation is the norms' statistics: given the whole call's (the oracle),
    the segment pushed in its blocks is the whole call, to float32's rounding."""
    whole, stream = _oracle_stream(engine, whole_calls, None)
    snr = _snr_db(whole, stream)
    assert snr >= 80, snr  # measured 118 dB


@pytest.mark.real_model
def test_the_engine_streams_its_resblocks_in_int8_close_to_the_float_call(
    engine: OnnxEngine, whole_calls: WholeCalls
) -> None:
    """On a CPU with oneDNN the engine computes the generator's resblocks' convolutions in
    int8 (as the registry graph's are): with the oracle's statistics, 8 bits' precision of
    the float call, and not the float stream."""
    from model_server.engines import int8

    streamed = engine._streamed
    assert streamed is not None
    if not int8.available():
        assert streamed.kernels is None
        pytest.skip("this torch has no oneDNN: the stream is float")
    assert streamed.kernels is not None
    whole, stream = _oracle_stream(engine, whole_calls, streamed.kernels)
    snr = _snr_db(whole, stream)
    assert 20 <= snr < 80, snr  # measured 24 dB


@pytest.mark.real_model
def test_a_block_gives_its_frames_but_the_generators_lookahead(engine: OnnxEngine) -> None:
    """The body ran over the whole segment when it opened: the audio trails the frames pushed
    by the generator's lookahead alone (5.4 frames), so a first window of 24 frames needs two
    blocks of 16, not three."""
    front = engine.front(FOX, VOICE, 1.0, CancelToken())
    engine.decode(front, Window(0, 1, 0, 0), CancelToken())
    assert front.features.pushed == 1
    behind = FIRST_BLOCKS[0] * SAMPLES_PER_FRAME - front.features.computed
    assert 5 * SAMPLES_PER_FRAME < behind < 6 * SAMPLES_PER_FRAME
    engine.decode(front, Window(1, 24, 0, 0), CancelToken())
    assert front.features.pushed == 2


@pytest.mark.real_model
def test_cancelling_stops_the_stream_between_blocks(engine: OnnxEngine) -> None:
    front = engine.front(FOX, VOICE, 1.0, CancelToken())
    first = engine.decode(front, Window(0, 10, 0, 0), CancelToken())
    assert first.size == 10 * SAMPLES_PER_FRAME
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(SynthesisCancelled):
        engine.decode(front, Window(10, front.frames, 0, 0), cancel)
    # out of order, or with context: refused by name, not a wrong answer
    with pytest.raises(SynthesisFailed, match="next starts at 10"):
        engine.decode(front, Window(20, 30, 0, 0), CancelToken())
    with pytest.raises(SynthesisFailed, match="no context"):
        engine.decode(front, Window(10, 30, 3, 3), CancelToken())


@pytest.mark.real_model
def test_the_word_timings_read_the_whole_calls_durations(engine: OnnxEngine) -> None:
    for phonemes in (HELLO, FOX):
        whole = engine.infer_timed(phonemes, VOICE, 1.0, CancelToken())
        front = engine.front(phonemes, VOICE, 1.0, CancelToken())
        assert np.array_equal(front.durations, whole.durations)
        assert front.frames * SAMPLES_PER_FRAME == whole.audio.size


@pytest.mark.real_model
def test_the_body_normalises_by_the_segments_own_and_the_generator_by_the_voices(
    engine: OnnxEngine, whole_calls: WholeCalls
) -> None:
    streamed = engine._streamed
    assert streamed is not None
    front = engine.front(FOX, VOICE, 1.0, CancelToken())
    _, _, oracle = whole_calls(FOX)
    priors = engine._stream_priors
    assert priors is not None
    prior = priors(VOICE).at(front.frames)
    got = front.features.statistics
    assert set(got) == set(oracle)
    generator = {k for k in got if k.startswith("generator.")}
    assert generator == set(prior) == set(streamed.generator_norms)
    assert len(generator) < len(got)  # the body has norms of its own
    for name, (mean, var) in got.items():
        want = prior[name] if name in generator else oracle[name]
        torch.testing.assert_close(mean, want[0])
        torch.testing.assert_close(var, want[1])
    # and the prior is not the segment's own (or this test could not tell them apart)
    name = sorted(generator)[0]
    assert not torch.allclose(got[name][0], oracle[name][0])


def test_the_length_prior_is_its_points_at_them_and_between_them_in_one_over_frames() -> None:
    from model_server.engines.streamed import LengthPrior

    def point(mean: float, var: float) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {"n": (torch.tensor([[[mean]]]), torch.tensor([[[var]]]))}

    prior = LengthPrior(((200.0, point(2.0, 1.0)), (50.0, point(0.0, 1.0))))
    for frames, want in ((10, 0.0), (50, 0.0), (200, 2.0), (500, 2.0)):
        assert prior.at(frames)["n"][0].item() == pytest.approx(want)
    # 100 frames: between the points, linearly in 1 / frames (two thirds of the way to 200)
    mean, var = prior.at(100)["n"]
    w = (1 / 50 - 1 / 100) / (1 / 50 - 1 / 200)
    assert mean.item() == pytest.approx(2.0 * w)
    # the second moments interpolated, not the variances: the spread of the means adds to it
    assert var.item() == pytest.approx(1.0 + w * 4.0 - (2.0 * w) ** 2)


@pytest.mark.real_model
def test_a_short_segment_speaks_at_one_calls_level(
    engine: OnnxEngine, whole_calls: WholeCalls
) -> None:
    """The generator's prior is the voice's at the segment's length: "Hello there." streams
    at the level of its own whole call (with one prior of long sentences it was 15 dB per
    frame quieter, its fading end trimmed), and no segment moves far from it."""
    for phonemes in (HELLO, FOX):
        front = engine.front(phonemes, VOICE, 1.0, CancelToken())
        _, whole, _ = whole_calls(phonemes)
        stream = engine.decode(front, Window(0, front.frames, 0, 0), CancelToken())
        error = closeness.envelope_db(stream[: whole.size], whole)  # where it speaks
        assert error < 2.0, (phonemes, error)  # measured 0.70 and 0.28 dB


def test_the_onnx_engine_needs_torch_only_for_the_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The CPU image has no torch: the onnx engine and the server import without it, and
    asking for the stream there is refused by name at start."""
    import subprocess
    import sys

    hidden = "import sys; sys.modules['torch'] = None; "
    code = hidden + "import model_server.engines.onnx, model_server.service; print('imported')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "imported"

    import importlib.util

    from model_server.engines import onnx
    from model_server.errors import ModelUnavailable

    # here torch and kokoro are installed: the default is the stream
    assert onnx.OnnxOptions().decoder == "auto"
    assert onnx.chosen_decoder("auto") == "stream"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert onnx.chosen_decoder("windows") == "windows"
    assert onnx.chosen_decoder("auto") == "windows"
    with pytest.raises(ModelUnavailable, match="torch extra"):
        onnx.chosen_decoder("stream")
    with pytest.raises(ValueError, match="one of auto, stream, windows"):
        onnx.chosen_decoder("exact")


# --- batched steps (`--batch on`) ----------------------------------------------------------

ORDER = "jʊɹ ˈɔɹdəɹ ʃˈɪpt ðɪs mˈɔɹnɪŋ ænd əɹɹˈIvz ˌɔn fɹˈIdA."


@pytest.mark.real_model
def test_segments_decoded_in_one_batch_are_each_the_same_bytes_as_alone(
    engine: OnnxEngine,
) -> None:
    """Three segments of other lengths, their steps batched while their blocks line up (the
    int8 convolutions quantise row by row, the float ones compute row by row): each one's
    samples are bit for bit what it gets alone."""
    texts = [FOX, ORDER, HELLO]
    alone = [_audio(engine, t, [10_000]) for t in texts]
    together, batches = batched_decodes(engine, VOICE, texts)
    assert batches.get(3, 0) >= 1  # the first blocks ran as one batch of three
    for a, b in zip(alone, together, strict=True):
        assert b is not None
        assert b.size == a.size
        assert np.array_equal(a, b)


@pytest.mark.real_model
def test_a_segment_cancelled_in_the_queue_leaves_its_batch_and_the_others_unchanged(
    engine: OnnxEngine,
) -> None:
    texts = [FOX, ORDER, HELLO]
    alone = [_audio(engine, t, [10_000]) for t in texts]
    together, batches = batched_decodes(engine, VOICE, texts, cancelled=1)
    assert together[1] is None  # SynthesisCancelled, at once
    assert batches.get(3, 0) == 0
    assert batches.get(2, 0) >= 1
    for i in (0, 2):
        got = together[i]
        assert got is not None
        assert np.array_equal(alone[i], got)


@pytest.mark.real_model
def test_the_decoder_on_one_thread_gives_the_segments_audio(engine: OnnxEngine) -> None:
    """`--decoder-threads 1` (`OnnxOptions.decoder_threads`): the streamed decoder's torch work
    on one thread while the engine's calls keep two; its samples are the two threads' but for
    the order of float sums in oneDNN's kernels, which the int8 layers may round otherwise."""
    from model_server.engines.onnx import OnnxOptions

    one = OnnxEngine(OnnxOptions(intra_op_threads=2, decoder="stream", decoder_threads=1))
    assert one._streamed is not None
    assert engine._streamed is not None
    assert one._streamed.thread.run(torch.get_num_threads) == 1
    assert engine._streamed.thread.run(torch.get_num_threads) == 2
    assert one.threads == engine.threads == (2, 2)
    alone, two = _audio(one, FOX, [8, 16, 64]), _audio(engine, FOX, [8, 16, 64])
    assert alone.shape == two.shape
    print(f"one thread against two: {_snr_db(two, alone):.1f} dB")
    assert _snr_db(two, alone) >= 30
