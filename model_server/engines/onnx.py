"""The default engine: Kokoro-82M int8 ONNX on onnxruntime's CPU provider.

It runs the model's timed variant (`weights.timed_model`): the same audio, and the frames the
model gave each phoneme beside it, for word timings. For progressive synthesis it also runs the
variant's parts (`weights.split_models`): `front` over a whole segment (about 4 % of a call),
then `decode` over its windows in order, each window in two runs: the decoder's body (its
frame-rate layers, about 5 % of the decoder) over the window with `Window.body`'s wider
context, then the generator over `Window.decoded` from the body's output, the harmonic source
sliced from the front pass's so the phase of every window is the whole segment's. The instance
norms' statistics are carried from window to window beside the voice's prior, which weighs
less as fewer frames are left to come (`carried_norms`: computed once per voice over a
reference text, and kept in the cache directory). With `OnnxOptions.decoder` stream the front
graph's output goes instead to the streamed decoder (`streamed`: torch, the graph's weights,
every layer's state carried, windows without context), imported only then."""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from kokoro_contract import blends
from model_server.batching import Policy
from model_server.engines import hub_voices
from model_server.engines import voices as voice_packs
from model_server.engines.base import (
    SAMPLES_PER_FRAME,
    CancelToken,
    FloatAudio,
    Front,
    Pause,
    Timed,
    char_durations,
    check_window,
    style_row,
    tokenize,
)
from model_server.engines.carried_norms import (
    CALIBRATION_PHONEMES,
    PRIOR_FRAMES,
    NormStats,
    blended_stats,
    carried_in,
    prepare_voice,
    voice_prior,
)
from model_server.engines.norm_graph import CORE_FRAMES, CORE_LEFT, FRAMES
from model_server.engines.weights import (
    BODY_INPUTS,
    DECODER_INPUTS,
    DURATIONS_OUTPUT,
    F0,
    FEATURES,
    GENERATOR_INPUT,
    GENERATOR_INPUTS,
    HARMONICS,
    NOISE,
    assemble_model,
    default_cache_dir,
    load_vocab,
    recorded_sha256,
    split_models,
    timed_model,
)
from model_server.errors import ModelUnavailable, SynthesisCancelled, SynthesisFailed
from model_server.text.split import MAX_PHONEMES
from model_server.windows import Window

if TYPE_CHECKING:  # torch: imported only with --decoder stream (the CPU image has none)
    from model_server.engines.streamed import Inputs, StreamedDecoder, StreamPriors

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnnxOptions:
    model_path: Path | None = None  # default: assembled from the registry packages
    cache_dir: Path | None = None  # also where the timed variant of a model_path is made
    voices_dir: Path | None = None
    english_voices: str = "off"  # auto: Kokoro's English packs from the hub (`hub_voices`)
    intra_op_threads: int = 0  # 0: all cores
    # threads of a call that starts while another runs: calls side by side then share the
    # cores instead of oversubscribing them (0: the same as intra_op_threads)
    shared_threads: int = 0
    spinning: bool = False  # busy-wait between ops: faster alone, wasteful beside other workers
    decoder_threads: int = 0  # the streamed decoder's torch threads (0: intra_op_threads)
    progressive: bool = True  # also load the front graph and a decoder for windows
    # the decoder of progressive synthesis: stream (every layer's state carried, exact, the
    # voice's prior at the segment's length for the generator's norms: `streamed`; torch with
    # the registry's weights, the generator's resblocks in int8), windows (the body and
    # generator graphs over windows with context, crossfaded, the norms carried:
    # `carried_norms`), or auto: stream where torch and kokoro are installed, else windows
    # (`chosen_decoder`)
    decoder: str = "auto"
    # the streamed decoder's steps of several segments run as one batch by this policy
    # (`batcher`); None: each alone
    batch: Policy | None = None


# how each decoder input is sliced for a window of frames [start, end): its axis and the
# elements per frame (F0, N and the body's output run at twice the frame rate, the harmonic
# source at 600)
_PER_FRAME = {
    FEATURES: (2, 1),
    F0: (1, 2),
    NOISE: (1, 2),
    HARMONICS: (1, SAMPLES_PER_FRAME),
    GENERATOR_INPUT: (2, 2),
}


DECODERS = ("auto", "stream", "windows")


def chosen_decoder(asked: str) -> str:
    """`OnnxOptions.decoder`, checked and resolved: stream needs torch and kokoro (the
    project's `torch` extra, which `make setup` installs); auto is stream where they are
    installed, windows where not (the CPU image)."""
    if asked not in DECODERS:
        raise ValueError(f"decoder {asked!r}: one of {', '.join(DECODERS)}")
    missing = any(importlib.util.find_spec(m) is None for m in ("torch", "kokoro"))
    if asked == "auto":
        return "windows" if missing else "stream"
    if asked == "stream" and missing:
        raise ModelUnavailable("--decoder stream needs torch and kokoro (the torch extra)")
    return asked


def _streamed_decoder(model: Path, threads: int, batch: Policy | None) -> StreamedDecoder:
    """The registry graph's decoder weights in kokoro's torch `Decoder`, streamed, computing
    on `threads` CPU threads of its own thread (built there too), several segments' steps in
    one batch by `batch` (None: each alone); the generator's resblocks' convolutions in int8
    where this torch has oneDNN's (`int8`), as the graph's are."""
    import onnx

    from model_server.engines import int8
    from model_server.engines.registry_decoder import GRAPH_GAIN, registry_decoder
    from model_server.engines.streamed import StreamedDecoder, runner

    thread = runner(threads, batch)
    decoder = thread.run(registry_decoder, onnx.load(str(model)))
    return StreamedDecoder(decoder, thread, int8=int8.available(), gain=GRAPH_GAIN)


class OnnxEngine:
    name = "onnx"
    max_phonemes = MAX_PHONEMES

    def __init__(self, options: OnnxOptions) -> None:
        cache_dir = options.cache_dir or default_cache_dir()
        model = timed_model(options.model_path or assemble_model(cache_dir), cache_dir)
        alone = options.intra_op_threads or (os.cpu_count() or 1)
        shared = options.shared_threads or alone
        self._whole = self._sessions(model, alone, shared, options.spinning)
        self._front_sessions: Sessions | None = None
        self._split: tuple[Sessions, Sessions] | None = None  # windows: body, generator
        self._streamed: StreamedDecoder | None = None
        self._norms = 0
        self._priors: dict[str, NormStats] = {}
        self._stream_priors: StreamPriors | None = None
        self._prior_lock = threading.Lock()  # one calibration at a time
        self._prior_key = ""
        self._prior_dir = cache_dir / "norm-priors"
        decoder = self.decoder = chosen_decoder(options.decoder)
        if options.progressive:
            parts = split_models(model, cache_dir)
            self._front_sessions = self._sessions(parts[0], alone, shared, options.spinning)
            if decoder == "stream":
                from model_server.engines.streamed import StreamPriors

                threads = options.decoder_threads or alone
                self._streamed = _streamed_decoder(model, threads, options.batch)
                self._stream_priors = StreamPriors(
                    self._streamed,
                    self._prior_dir,
                    f"stream:{recorded_sha256(model)}",
                    self._stream_inputs,
                    lambda voice: self._packs[voice],
                )
            else:
                body, generator = (
                    self._sessions(p, alone, shared, options.spinning) for p in parts[1:]
                )
                self._split = (body, generator)
                self._norms = sum(1 for n in body.inputs | generator.inputs if n.endswith("/sum"))
                self._prior_key = ":".join(recorded_sha256(p) for p in parts[1:])
        self._running = 0
        self._lock = threading.Lock()
        self._vocab = load_vocab()
        english = hub_voices.english_voices(options.english_voices)
        self.voice_note = english.summary
        packs, self._origin = voice_packs.load_voices(
            options.voices_dir, extra=(english.source, english.packs)
        )
        self._packs = voice_packs.Packs(packs)  # and blends of them
        self.threads = (alone, shared)
        log.info(
            "onnx engine: %s, %d threads per call (%d beside another), %s, voices %s; %s",
            model,
            alone,
            shared,
            f"progressive decoder {decoder}" if options.progressive else "whole calls",
            ", ".join(self._packs),
            self.voice_note,
        )

    @classmethod
    def _sessions(cls, model: Path, alone: int, shared: int, spinning: bool) -> Sessions:
        first = cls._session(model, alone, spinning)
        return Sessions(
            first,
            first if shared == alone else cls._session(model, shared, False),
            frozenset(i.name for i in first.get_inputs()),
            tuple(o.name for o in first.get_outputs()),
        )

    @staticmethod
    def _session(model: Path, threads: int, spinning: bool) -> ort.InferenceSession:
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
        return ort.InferenceSession(str(model), sess_options=so, providers=["CPUExecutionProvider"])

    @property
    def description(self) -> str:
        decoder = "" if self._front_sessions is None else f", decoder {self.decoder}"
        return f"onnx on cpu ({self.threads[0]} threads{decoder})"

    def voices(self) -> dict[str, str]:
        return dict(self._origin)

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        return self.infer_timed(phonemes, voice, speed, cancel).audio

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        tokens, feed = self._feed(phonemes, voice, speed)
        if not tokens:
            return Timed(np.zeros(0, np.float32), np.zeros(len(phonemes) + 2, np.int64), 1)
        audio, durations = self._run(self._whole, feed, cancel, ["audio", DURATIONS_OUTPUT])
        return Timed(
            np.asarray(audio, dtype=np.float32).ravel(),
            char_durations(phonemes, self._vocab, durations),
            SAMPLES_PER_FRAME,
        )

    @property
    def two_passes(self) -> bool:
        """Loaded with its front graph (`OnnxOptions.progressive`)."""
        return self._front_sessions is not None

    @property
    def exact_windows(self) -> bool:
        """Whether `decode` gives a window's frames as one call would, with no context: the
        streamed decoder (`OnnxOptions.decoder` stream)."""
        return self._streamed is not None

    def batch_curve(self) -> dict[str, float] | None:
        return None if self._streamed is None else self._streamed.thread.batch_curve()

    def front(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Front:
        if self._front_sessions is None:
            raise SynthesisFailed("this onnx engine was loaded without its progressive graphs")
        if self._streamed is not None:
            return self._stream_front(phonemes, voice, speed, cancel)
        return self._window_front(phonemes, voice, speed, cancel, self._prior(voice))

    def _window_front(
        self, phonemes: str, voice: str, speed: float, cancel: CancelToken, prior: NormStats
    ) -> Front:
        tokens, feed = self._feed(phonemes, voice, speed)
        if not tokens:
            empty = _Segment({}, prior, NormStats.none(len(prior.sums)))
            return Front(0, np.zeros(len(phonemes) + 2, np.int64), SAMPLES_PER_FRAME, empty)
        frames, durations, features = self._front_pass(phonemes, feed, cancel)
        tensors = dict(zip(DECODER_INPUTS, features, strict=True))
        segment = _Segment(tensors, prior, NormStats.none(len(prior.sums)))
        return Front(frames, durations, SAMPLES_PER_FRAME, segment)

    def _front_pass(
        self, phonemes: str, feed: dict[str, Any], cancel: CancelToken
    ) -> tuple[int, Any, list[Any]]:
        """The front graph over a segment: its frames, its durations (`Timed.durations`), the
        decoder's inputs (`DECODER_INPUTS`)."""
        assert self._front_sessions is not None
        outputs = [*DECODER_INPUTS, DURATIONS_OUTPUT]
        *features, durations = self._run(self._front_sessions, feed, cancel, outputs)
        frames = int(np.asarray(durations).sum())
        return frames, char_durations(phonemes, self._vocab, durations), features

    def _stream_front(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Front:
        from model_server.engines.streamed import Inputs

        assert self._streamed is not None
        assert self._stream_priors is not None
        prior = self._stream_priors(voice)
        tokens, feed = self._feed(phonemes, voice, speed)
        if not tokens:
            return Front(0, np.zeros(len(phonemes) + 2, np.int64), SAMPLES_PER_FRAME, None)
        _, durations, features = self._front_pass(phonemes, feed, cancel)
        return self._streamed.front(durations, Inputs.from_graph(features), prior)

    def prepare_voice(self, voice: str, pause: Pause) -> bool:
        """`voice`'s norm priors made ahead of its first segment (`carried_norms.prepare_voice`)."""
        windows = self._prior if self.two_passes else None
        return prepare_voice(voice, pause, self._stream_priors, windows)

    def decode(self, front: Front, window: Window, cancel: CancelToken) -> FloatAudio:
        if self._streamed is not None:
            from model_server.engines.streamed import decode_window

            return decode_window(front, window, cancel)
        if self._split is None:
            raise SynthesisFailed("this onnx engine was loaded without its progressive graphs")
        segment = front.features
        if not isinstance(segment, _Segment):
            raise SynthesisFailed("a front pass of another engine")
        check_window(window, front.frames)
        start, end = window.decoded
        body_start, body_end = window.body
        if window.start != segment.next_start:
            raise SynthesisFailed(
                f"a window at frame {window.start}: this segment's next starts at "
                f"{segment.next_start} (its windows are decoded in order)"
            )
        body, generator = self._split
        carried = segment.carried(front.frames - window.end).feed()
        carried[CORE_FRAMES] = np.array([window.end - window.start], np.float32)
        feed = {
            name: _window(name, segment.tensors[name], body_start, body_end) for name in BODY_INPUTS
        }
        feed[CORE_LEFT] = np.array([window.start - body_start], np.float32)
        feed[FRAMES] = np.array([body_end - body_start], np.float32)
        outputs = dict(zip(body.outputs, self._run(body, carried | feed, cancel), strict=True))
        from_body = _window(
            GENERATOR_INPUT, outputs.pop(GENERATOR_INPUT), start - body_start, end - body_start
        )
        feed = {
            name: _window(name, segment.tensors[name], start, end) for name in GENERATOR_INPUTS[1:]
        }
        feed[GENERATOR_INPUT] = from_body
        feed[CORE_LEFT] = np.array([window.left], np.float32)
        feed[FRAMES] = np.array([end - start], np.float32)
        outputs |= zip(generator.outputs, self._run(generator, carried | feed, cancel), strict=True)
        out = np.asarray(outputs.pop("audio"), dtype=np.float32).ravel()
        if out.size != window.frames * SAMPLES_PER_FRAME:
            raise SynthesisFailed(f"{out.size} samples for {window.frames} frames")
        core = NormStats.from_outputs(outputs, self._norms, window.end - window.start)
        segment.seen = segment.seen.plus(core)
        segment.next_start = window.end
        return out

    def _prior(self, voice: str) -> NormStats:
        """The voice's instance-norm statistics over the reference text, weighing
        `PRIOR_FRAMES`: from memory, the cache directory, or computed (once per voice, in a
        few seconds: one decoder pass over about 11 s of speech); a blend's, its voices'
        (`blended_stats`)."""
        if blends.is_blend(voice):
            parts = blends.parse_blend(voice).shares
            return blended_stats([(self._prior(name), share) for name, share in parts])
        with self._prior_lock:
            known = self._priors.get(voice)
            if known is not None:
                return known
            norms = self._norms
            stats = voice_prior(
                self._prior_dir,
                voice,
                self._prior_key,
                self._packs[voice],
                norms,
                lambda: self._calibrate(voice, norms),
            )
            prior = stats.scaled(PRIOR_FRAMES)
            self._priors[voice] = prior
            return prior

    def _stream_inputs(self, phonemes: str, voice: str) -> Inputs:
        """The streamed decoder's inputs for `phonemes` at speed 1 (the priors' calibration)."""
        from model_server.engines.streamed import Inputs

        _, feed = self._feed(phonemes, voice, 1.0)
        _, _, features = self._front_pass(phonemes, feed, CancelToken())
        return Inputs.from_graph(features)

    def _calibrate(self, voice: str, norms: int) -> NormStats:
        """The statistics of every norm over the reference text, each segment in one window."""
        total: NormStats | None = None
        for phonemes in CALIBRATION_PHONEMES:
            cancel = CancelToken()
            front = self._window_front(phonemes, voice, 1.0, cancel, NormStats.none(norms))
            self.decode(front, Window(0, front.frames, 0, 0), cancel)
            seen = front.features.seen
            total = seen if total is None else total.plus(seen)
        assert total is not None
        return total

    def _feed(self, phonemes: str, voice: str, speed: float) -> tuple[list[int], dict[str, Any]]:
        tokens = tokenize(phonemes, self._vocab, self.max_phonemes)
        pack = self._packs[voice]
        style = pack[style_row(max(1, len(tokens)), len(pack))].reshape(1, -1)
        return tokens, {
            "tokens": np.array([[0, *tokens, 0]], dtype=np.int64),
            "style": style.astype(np.float32),
            "speed": np.array([speed], dtype=np.float32),
        }

    def _run(
        self,
        sessions: Sessions,
        feed: dict[str, Any],
        cancel: CancelToken,
        outputs: list[str] | None = None,
    ) -> list[Any]:
        """`outputs` (default: all the graph's, in order) of one run over the inputs of `feed`
        that the graph has."""
        run_options = ort.RunOptions()
        cancel.on_cancel(lambda: setattr(run_options, "terminate", True))
        if cancel.cancelled:
            raise SynthesisCancelled()
        with self._lock:
            session = sessions.alone if self._running == 0 else sessions.shared
            self._running += 1
        try:
            wanted = {k: v for k, v in feed.items() if k in sessions.inputs}
            return list(session.run(outputs or list(sessions.outputs), wanted, run_options))
        except Exception as exc:
            if cancel.cancelled:
                raise SynthesisCancelled() from exc
            raise SynthesisFailed(f"onnxruntime failed: {exc}") from exc
        finally:
            with self._lock:
                self._running -= 1


@dataclass
class _Segment:
    """The onnx engine's `Front.features`: the decoder's inputs over the whole segment, and what
    its windows carry from one to the next (the norms' statistics of the cores decoded so far,
    where the next core starts), beside the voice's prior."""

    tensors: dict[str, Any]
    prior: NormStats  # weighing PRIOR_FRAMES (none: no frames)
    seen: NormStats
    next_start: int = 0

    def carried(self, after: int) -> NormStats:
        """The statistics a window with `after` frames of the segment after it is normalised
        by, beside its own core's (`carried_norms.carried_in`)."""
        return carried_in(self.prior, self.seen, after)


@dataclass(frozen=True)
class Sessions:
    """One graph's sessions: for a call that runs alone, and for one beside another; the
    graph's input names and its outputs in order."""

    alone: ort.InferenceSession
    shared: ort.InferenceSession
    inputs: frozenset[str]
    outputs: tuple[str, ...]


def _window(name: str, tensor: Any, start: int, end: int) -> Any:
    if name not in _PER_FRAME:
        return tensor  # the style half: the same for every window
    axis, per_frame = _PER_FRAME[name]
    index = [slice(None)] * tensor.ndim
    index[axis] = slice(start * per_frame, end * per_frame)
    return np.ascontiguousarray(tensor[tuple(index)])
