"""Progressive synthesis by windows (`--decoder windows`) with the real Kokoro-82M int8 weights:
the split graphs (the front
pass and the decoder) against the whole graph, and the decoder over windows against one call
(guards: the level and spectrum within stated tolerances, DistillMOS, a seam detector, the
word timings). No timing in any assertion.

(The pure parts, the schedule and the seams, are in tests/model_server/test_windows.py.)"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import numpy as np
import orjson
import pytest

from model_server.engines import weights
from model_server.engines.base import CancelToken
from model_server.engines.carried_norms import CALIBRATION_PHONEMES, PRIOR_FRAMES, NormStats
from model_server.engines.onnx import OnnxEngine
from model_server.errors import SynthesisFailed
from model_server.windows import Joiner, Schedule, Speed, Window, plan_windows
from quality import closeness, judges, seams

pytestmark = pytest.mark.real_model

# literal phonemes (espeak's for "Hello there." and a pangram), so no G2P is involved
HELLO = "həlˈO ðˈɛɹ."
FOX = "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ nˌɪɹ ðə ɹˈɪvəɹ bˈæŋk."
VOICE = "jm_kumo"
NORMS = 54  # Kokoro's decoder: 54 instance norms (AdaIN), every one's statistics carried


@pytest.fixture
def engine(windows_engine: OnnxEngine) -> OnnxEngine:
    """The session's windows-decoder engine (tests/conftest.py), loaded once."""
    return windows_engine


@pytest.fixture(params=["windows", "stream"])
def either(request: pytest.FixtureRequest) -> OnnxEngine:
    """Either decoder: the streamed one (`--decoder stream`, the session's `stream_engine`)
    is held to the same judges."""
    fixture = "windows_engine" if request.param == "windows" else "stream_engine"
    return request.getfixturevalue(fixture)  # type: ignore[no-any-return]


def test_the_split_graphs_are_made_once_beside_the_timed_variant_and_recorded(
    tmp_path: Path,
) -> None:
    timed = weights.timed_path(weights.assemble_model(tmp_path))
    parts = weights.split_models(timed, tmp_path / "elsewhere")
    assert [p.name for p in parts] == [
        "kokoro-v1.0.int8.front.onnx",
        "kokoro-v1.0.int8.body.onnx",
        "kokoro-v1.0.int8.generator.onnx",
    ]
    assert {p.parent for p in parts} == {tmp_path / "elsewhere"}  # made where asked
    source = hashlib.sha256(timed.read_bytes()).hexdigest()
    for path in parts:
        record = orjson.loads(path.with_name(f"{path.name}.json").read_bytes())
        assert record["source"] == timed.name
        assert record["source_sha256"] == source
        assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert record["cut_at"] == [*weights.DECODER_INPUTS, weights.GENERATOR_INPUT]
        assert record["carried_norms"] == NORMS
    mtimes = [p.stat().st_mtime_ns for p in parts]
    # the whole decoder a cache made before the generator's cut: read no more, removed
    decoder = tmp_path / "elsewhere" / "kokoro-v1.0.int8.decoder.onnx"
    decoder.write_bytes(b"the decoder before the cut")
    decoder.with_name(f"{decoder.name}.json").write_bytes(b"{}")
    assert weights.split_models(timed, tmp_path / "elsewhere") == parts
    assert [p.stat().st_mtime_ns for p in parts] == mtimes  # reused, not rebuilt
    assert not decoder.exists()
    assert not decoder.with_name(f"{decoder.name}.json").exists()
    generator = parts[2]
    with generator.open("r+b") as f:  # corrupt: made again
        f.seek(4000)
        f.write(b"\x00" * 64)
    weights.split_models(timed, tmp_path / "elsewhere")
    record = orjson.loads(generator.with_name(f"{generator.name}.json").read_bytes())
    assert record["sha256"] == hashlib.sha256(generator.read_bytes()).hexdigest()
    # a cache made before the generator's cut (two halves' records) is made again
    body = parts[1]
    old = orjson.loads(body.with_name(f"{body.name}.json").read_bytes())
    old["cut_at"] = list(weights.DECODER_INPUTS)
    body.with_name(f"{body.name}.json").write_bytes(orjson.dumps(old))
    decoder.write_bytes(b"the decoder before the cut")  # and its whole decoder, removed
    weights.split_models(timed, tmp_path / "elsewhere")
    remade = orjson.loads(body.with_name(f"{body.name}.json").read_bytes())
    assert remade["cut_at"] == [*weights.DECODER_INPUTS, weights.GENERATOR_INPUT]
    assert not decoder.exists()
    assert all(p.exists() for p in parts)


def test_the_body_and_the_generator_take_what_their_own_norms_read() -> None:
    """The decoder's norms are numbered over the whole decoder; each part takes the carried
    inputs of its own and gives their core sums: together, every norm once. (The parts of the
    cache the session's engines use: how they are made is the test above's.)"""
    import onnx

    cache = weights.default_cache_dir()
    timed = weights.timed_model(weights.assemble_model(cache), cache)
    _, body, generator = (onnx.load(str(p)) for p in weights.split_models(timed, cache))
    body_in = {i.name for i in body.graph.input}
    body_out = [o.name for o in body.graph.output]
    gen_in = {i.name for i in generator.graph.input}
    gen_out = [o.name for o in generator.graph.output]
    assert body_out[0] == weights.GENERATOR_INPUT
    assert gen_out[0] == "audio"
    assert set(weights.BODY_INPUTS) <= body_in
    assert weights.HARMONICS not in body_in
    assert set(weights.GENERATOR_INPUTS) <= gen_in
    assert weights.FEATURES not in gen_in
    body_norms = {int(n.split("/")[1]) for n in body_in if n.endswith("/sum")}
    gen_norms = {int(n.split("/")[1]) for n in gen_in if n.endswith("/sum")}
    assert body_norms
    assert gen_norms
    assert not body_norms & gen_norms
    assert body_norms | gen_norms == set(range(NORMS))
    assert {int(n.split("/")[1]) for n in body_out[1:]} == body_norms
    assert {int(n.split("/")[1]) for n in gen_out[1:]} == gen_norms


def test_the_graph_halves_in_sequence_are_the_whole_graph_sample_for_sample(
    engine: OnnxEngine,
) -> None:
    """With nothing carried in, the decoder (its norms rewritten to take carried statistics)
    computes what the registry's graph does: the two halves in sequence are the whole call."""
    cancel = CancelToken()
    nothing = NormStats.none(NORMS)
    for phonemes in (HELLO, FOX):
        whole = engine.infer_timed(phonemes, VOICE, 1.0, cancel)
        front = engine._window_front(phonemes, VOICE, 1.0, cancel, nothing)
        assert front.frames == int(whole.durations.sum())
        assert front.durations.tolist() == whole.durations.tolist()  # the same word timings
        audio = engine.decode(front, Window(0, front.frames, 0, 0), cancel)
        assert audio.size == whole.audio.size == front.frames * 600
        assert np.array_equal(audio, whole.audio)


def test_a_window_is_its_frames_of_audio_and_windows_go_in_order(engine: OnnxEngine) -> None:
    cancel = CancelToken()
    front = engine.front(FOX, VOICE, 1.0, cancel)
    assert engine.decode(front, Window(0, 24, 0, 10), cancel).size == 34 * 600
    with pytest.raises(SynthesisFailed, match="decoded in order"):  # not where the last ended
        engine.decode(front, Window(30, 54, 6, 10), cancel)
    assert engine.decode(front, Window(24, 48, 10, 10), cancel).size == 44 * 600
    with pytest.raises(SynthesisFailed, match="frames"):
        engine.decode(front, Window(48, front.frames + 1, 0, 0), cancel)


def test_the_prior_is_the_voices_over_the_reference_text_made_once_and_kept(
    engine: OnnxEngine, tmp_path: Path
) -> None:
    """Each norm starts from the voice's statistics over the reference text, computed once per
    voice and kept in the cache directory: a later engine reads them back; a damaged file is
    computed again."""
    engine._prior_dir, kept = tmp_path, engine._prior_dir
    engine._priors.pop(VOICE, None)
    try:
        prior = engine._prior(VOICE)
        (saved,) = tmp_path.glob(f"{VOICE}.*.npz")
        stats = NormStats.load(saved, NORMS)
        assert stats is not None
        # the reference text's frames, each norm's channels
        expected = sum(
            engine.front(p, VOICE, 1.0, CancelToken()).frames for p in CALIBRATION_PHONEMES
        )
        assert stats.frames == expected
        assert prior.frames == PRIOR_FRAMES
        assert len(stats.sums) == NORMS
        assert all(s.shape[1] > 1 for s in stats.sums)
        for s, p in zip(stats.sums, prior.sums, strict=True):
            np.testing.assert_allclose(p, s * (PRIOR_FRAMES / expected), rtol=1e-6)
        engine._priors.pop(VOICE)
        saved.write_bytes(b"not an npz")  # damaged: computed again, to the same statistics
        again = engine._prior(VOICE)
        for a, b in zip(again.sums, prior.sums, strict=True):
            np.testing.assert_array_equal(a, b)
        assert NormStats.load(saved, NORMS) is not None
    finally:
        engine._prior_dir = kept
        engine._priors.pop(VOICE, None)


def test_a_voice_prepared_ahead_is_the_prior_its_segments_read(either: OnnxEngine) -> None:
    """`prepare_voice` (the server's background work once ready) makes the voice's priors,
    either decoder's, as its first segment would: the same statistics, then known, and no
    stream waited meanwhile."""
    streamed = either._stream_priors
    known: dict[str, object] = streamed._known if streamed is not None else either._priors  # type: ignore[assignment]
    before = known.pop(VOICE, None)
    try:
        waited: list[bool] = []
        either.prepare_voice(VOICE, lambda wanted: waited.append(wanted()))
        assert VOICE in known
        assert not any(waited)
        made = known[VOICE]
        asked = streamed(VOICE) if streamed is not None else either._prior(VOICE)
        assert asked is made  # what a segment reads now: no second calibration
        if before is not None:  # the same as made before (kept in the cache directory)
            _same_prior(made, before)
    finally:
        if before is not None:
            known[VOICE] = before


def _same_prior(a: object, b: object) -> None:
    """Two priors of a voice hold the same statistics: the windows decoder's (`NormStats`) or
    the streamed decoder's (`LengthPrior`, by length)."""
    if isinstance(a, NormStats):
        assert isinstance(b, NormStats)
        assert a.frames == b.frames
        for x, y in zip((*a.sums, *a.squares), (*b.sums, *b.squares), strict=True):
            np.testing.assert_array_equal(x, y)
        return
    points_a, points_b = a.points, b.points  # type: ignore[attr-defined]
    assert [f for f, _ in points_a] == [f for f, _ in points_b]
    for (_, x), (_, y) in zip(points_a, points_b, strict=True):
        assert x.keys() == y.keys()
        for name in x:
            for u, v in zip(x[name], y[name], strict=True):
                np.testing.assert_array_equal(u.cpu().numpy(), v.cpu().numpy())


# --- the decoder over windows against one call ---------------------------------------------------

# several seams, whatever the machine's speed: the schedule as the server plans it at RTF 0.5
AT_HALF_REALTIME = Speed(per_call=0.0, per_frame=0.0125, frame_s=0.025)
SENTENCES = {
    "fox": FOX,
    "evening": (
        "wˌɛn ðɪ ˈivnɪŋ lˈIt fˈɛl əkɹˈɔs ðə vˈæli, ðə tɹˈævələɹz stˈɑpt tə ɹˈɛst, kˈWntɪŋ ðə "
        "mˈIlz ðA hæd wˈɔkt ænd ðə wˈʌnz stˈɪl əhˈɛd ʌv ðˌɛm bᵻfˌɔɹ dˈɔn."
    ),
}
# stated tolerances, measured on these sentences with the default schedule (2026-12-01): the
# level of each 25 ms frame within 30 dB of the loudest, 0.86-1.23 dB from one call's on average
# with the norms' statistics carried (each window's own gave 2.7-2.8 dB: the bound below fails
# them), the spectrum 3.9-4.0 dB (each window's own: 5.5-5.9; every bin within 60 dB of the
# loudest); DistillMOS +0.02 and +0.08 against one call; at the seams the step 0.44-0.72 (the
# same points of one call: 0.43-0.85; hard cuts measured 1.45-3.05), high frequencies 0.49-0.90
# (0.36-0.86), level 0.42-0.84 (0.60-0.90)
ENVELOPE_DB = 1.8
# the streamed decoder (2026-12-06): the generator normalised by the voice's prior, whose level
# a segment follows more or less closely: 0.37 dB on the fox, 2.04 on the evening sentence; the
# spectrum 2.8 and 4.2 dB, DistillMOS +0.03 and +0.13 against one call
STREAM_ENVELOPE_DB = 2.5
SPECTRUM_DB = 5.0
MOS_MARGIN = 0.10
SEAM_STEP = 1.3
SEAM_HF = 2.0
SEAM_LEVEL = 2.0


def _progressive(
    engine: OnnxEngine, phonemes: str, voice: str = VOICE
) -> tuple[np.ndarray, list[int]]:
    """The segment's audio as the server makes it, window by window, and where its seams are."""
    cancel = CancelToken()
    front = engine.front(phonemes, voice, 1.0, cancel)
    schedule = Schedule()
    if engine.exact_windows:  # as the synthesizer asks it: no context, no crossfade
        schedule = dataclasses.replace(schedule, context=0, body_context=0, crossfade=0)
    pause = int(front.durations[0])  # the pad before the first phoneme, as the server reads it
    windows = plan_windows(front.frames, schedule, AT_HALF_REALTIME, pause=pause)
    assert windows[0].end == schedule.first + pause - schedule.lead_margin
    joiner = Joiner(front.frame_samples, schedule.crossfade)
    pieces = []
    for window in windows:
        pieces.append(joiner.push(window, engine.decode(front, window, cancel)))
    return np.concatenate(pieces), [w.start * front.frame_samples for w in windows[1:]]


class OneCalls:
    """Each sentence's one call (`infer`: the registry's whole graph, which both decoders'
    engines run in sessions of the same options: the same samples) and its DistillMOS, computed
    once in the module for both decoders' tests."""

    def __init__(self, mos_judge: judges.MosJudge) -> None:
        self._mos_judge = mos_judge
        self._known: dict[str, tuple[np.ndarray, float]] = {}

    def __call__(self, engine: OnnxEngine, phonemes: str) -> tuple[np.ndarray, float]:
        if phonemes not in self._known:
            whole = engine.infer(phonemes, VOICE, 1.0, CancelToken())
            self._known[phonemes] = (whole, closeness.mos(self._mos_judge, whole))
        return self._known[phonemes]


@pytest.fixture(scope="module")
def one_calls(mos_judge: judges.MosJudge) -> OneCalls:
    return OneCalls(mos_judge)


@pytest.mark.parametrize("name", sorted(SENTENCES))
def test_progressive_audio_is_the_whole_calls_within_tolerance_and_its_seams_are_inaudible(
    either: OnnxEngine, mos_judge: judges.MosJudge, one_calls: OneCalls, name: str
) -> None:
    engine = either
    phonemes = SENTENCES[name]
    whole, whole_mos = one_calls(engine, phonemes)
    progressive, at = _progressive(engine, phonemes)
    assert len(at) >= 2  # seams to judge
    assert progressive.size == whole.size
    # the level, frame by frame, where there is speech
    envelope = closeness.envelope_db(progressive, whole)
    assert envelope < (STREAM_ENVELOPE_DB if engine.exact_windows else ENVELOPE_DB), envelope
    # the spectrum (int8 decodings of different lengths quantize differently: the waveforms
    # differ in fine phase, not in what is heard)
    spectrum = closeness.spectrum_difference_db(progressive, whole)
    assert spectrum < SPECTRUM_DB, spectrum
    # the judge
    scores = {"whole": whole_mos, "progressive": closeness.mos(mos_judge, progressive)}
    assert scores["progressive"] >= scores["whole"] - MOS_MARGIN, scores
    if engine.exact_windows:
        # no seams: its samples do not depend on its windows
        # (tests/model_server/engines/test_streamed.py)
        return
    # the seams: no step, no burst of high frequencies, no jump in level
    report = seams.seams(progressive, at)
    assert report.worst_jump < SEAM_STEP, report
    assert report.worst_hf < SEAM_HF, report
    assert report.worst_level_db < SEAM_LEVEL, report


# a blend of the registry's two voices, as a request's check spells it
BLEND = "jf_alpha(1)+jm_kumo(1)"


def test_a_blend_is_synthesized_with_the_mixed_style(stream_engine: OnnxEngine) -> None:
    """One call of a blend is one call of a pack that is its voices' packs mixed by their
    shares (here put among the loaded voices by hand), and differs from each voice's."""
    packs = stream_engine._packs  # the loaded packs, and blends of them
    blend = stream_engine.infer(FOX, BLEND, 1.0, CancelToken())
    mixed = packs["jf_alpha"] * np.float32(0.5) + packs["jm_kumo"] * np.float32(0.5)
    packs._packs["test_mixed"] = mixed
    try:
        by_hand = stream_engine.infer(FOX, "test_mixed", 1.0, CancelToken())
    finally:
        del packs._packs["test_mixed"]
    np.testing.assert_array_equal(blend, by_hand)
    for voice in ("jf_alpha", "jm_kumo"):
        alone = stream_engine.infer(FOX, voice, 1.0, CancelToken())
        n = min(alone.size, blend.size)
        assert not np.allclose(alone[:n], blend[:n], atol=1e-3), voice
    assert "test_mixed" not in packs
    assert BLEND not in packs  # `in`: the loaded voices only
    assert list(packs) == list(stream_engine.voices())


def test_a_blend_streams_as_its_one_call_within_the_same_tolerances(
    either: OnnxEngine, mos_judge: judges.MosJudge
) -> None:
    """A blend's prior is its voices' pooled (no calibration of its own): its stream is held
    to what a loaded voice's is, against the blend's one call."""
    engine = either
    whole = engine.infer(FOX, BLEND, 1.0, CancelToken())
    progressive, _ = _progressive(engine, FOX, BLEND)
    assert progressive.size == whole.size
    envelope = closeness.envelope_db(progressive, whole)
    assert envelope < (STREAM_ENVELOPE_DB if engine.exact_windows else ENVELOPE_DB), envelope
    spectrum = closeness.spectrum_difference_db(progressive, whole)
    assert spectrum < SPECTRUM_DB, spectrum
    scores = {
        "whole": closeness.mos(mos_judge, whole),
        "progressive": closeness.mos(mos_judge, progressive),
    }
    assert scores["progressive"] >= scores["whole"] - MOS_MARGIN, scores


async def test_word_timings_progressive_are_the_whole_calls(either: OnnxEngine) -> None:
    engine = either
    from kokoro_contract.protocol import SynthesisRequest
    from model_server.scheduler import Scheduler
    from model_server.synthesis import Synthesizer
    from model_server.text.g2p import english_g2p
    from model_server.timings import PAUSE_S

    g2p = english_g2p()
    text = "The quick brown fox jumps over the lazy dog near the river bank, twice."
    got = {}
    for progressive in (False, True):
        synthesizer = Synthesizer(engine, g2p, Scheduler(1), progressive=progressive)
        try:
            request = SynthesisRequest(text, VOICE, 1.0, "t", timestamps=True)
            chunks = [c async for c in synthesizer.stream_timed(request, "k")]
        finally:
            synthesizer.close()
        got[progressive] = [w for c in chunks for w in c.words or ()]
        if progressive:
            assert sum(1 for c in chunks if c.pcm) >= 2  # it did stream in windows
    assert [w.word for w in got[True]] == [w.word for w in got[False]]
    assert len(got[True]) == len(text.split())
    # the same frames (the front pass is the whole graph's: test above), read through the same
    # trimming and the same pause rule; both read the audio's level, which differs by a few dB
    # here and there: a word's end can move by the pause rule's 150 ms, no more
    for p, w in zip(got[True], got[False], strict=True):
        assert p.start == pytest.approx(w.start, abs=0.03), (p, w)
        assert p.end == pytest.approx(w.end, abs=PAUSE_S + 0.03), (p, w)
    ends = [abs(p.end - w.end) < 0.03 for p, w in zip(got[True], got[False], strict=True)]
    assert sum(ends) >= len(ends) - 2, (got[True], got[False])
