"""Progressive synthesis with the real Kokoro-82M int8 weights: the split graphs (the front
pass and the decoder) against the whole graph, and the decoder over windows against one call.

(The pure parts, the schedule and the seams, are in test_windows.py.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import orjson
import pytest

from model_server.engines import weights
from model_server.engines.base import CancelToken
from model_server.engines.onnx import OnnxEngine, OnnxOptions

pytestmark = pytest.mark.real_model

# literal phonemes (espeak's for "Hello there." and a pangram), so no G2P is involved
HELLO = "həlˈO ðˈɛɹ."
FOX = "ðə kwˈɪk bɹˈWn fˈɑks ʤˈʌmps ˌOvəɹ ðə lˈAzi dˈɑɡ nˌɪɹ ðə ɹˈɪvəɹ bˈæŋk."
VOICE = "jm_kumo"


@pytest.fixture(scope="module")
def engine() -> OnnxEngine:
    return OnnxEngine(OnnxOptions(intra_op_threads=2))


def test_the_split_graphs_are_made_once_beside_the_timed_variant_and_recorded(
    tmp_path: Path,
) -> None:
    timed = weights.timed_path(weights.assemble_model(tmp_path))
    front, decoder = weights.split_models(timed, tmp_path / "elsewhere")
    assert (front.name, decoder.name) == (
        "kokoro-v1.0.int8.front.onnx",
        "kokoro-v1.0.int8.decoder.onnx",
    )
    assert front.parent == decoder.parent == tmp_path / "elsewhere"  # made where asked
    source = hashlib.sha256(timed.read_bytes()).hexdigest()
    for path in (front, decoder):
        record = orjson.loads(path.with_name(f"{path.name}.json").read_bytes())
        assert record["source"] == timed.name
        assert record["source_sha256"] == source
        assert record["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert record["cut_at"] == list(weights.DECODER_INPUTS)
    mtimes = [p.stat().st_mtime_ns for p in (front, decoder)]
    assert weights.split_models(timed, tmp_path / "elsewhere") == (front, decoder)
    assert [p.stat().st_mtime_ns for p in (front, decoder)] == mtimes  # reused, not rebuilt
    with decoder.open("r+b") as f:  # corrupt: made again
        f.seek(4000)
        f.write(b"\x00" * 64)
    weights.split_models(timed, tmp_path / "elsewhere")
    record = orjson.loads(decoder.with_name(f"{decoder.name}.json").read_bytes())
    assert record["sha256"] == hashlib.sha256(decoder.read_bytes()).hexdigest()


def test_the_graph_halves_in_sequence_are_the_whole_graph_sample_for_sample(
    engine: OnnxEngine,
) -> None:
    cancel = CancelToken()
    for phonemes in (HELLO, FOX):
        whole = engine.infer_timed(phonemes, VOICE, 1.0, cancel)
        front = engine.front(phonemes, VOICE, 1.0, cancel)
        assert front.frames == int(whole.durations.sum())
        assert front.durations.tolist() == whole.durations.tolist()  # the same word timings
        audio = engine.decode(front, 0, front.frames, cancel)
        assert audio.size == whole.audio.size == front.frames * 600
        assert np.array_equal(audio, whole.audio)


def test_a_window_is_its_frames_of_audio(engine: OnnxEngine) -> None:
    cancel = CancelToken()
    front = engine.front(FOX, VOICE, 1.0, cancel)
    assert engine.decode(front, 10, 34, cancel).size == 24 * 600
    with pytest.raises(Exception, match="frames"):
        engine.decode(front, 0, front.frames + 1, cancel)
