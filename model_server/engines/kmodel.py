"""The GPU engine: the `kokoro` package's KModel on torch, on CUDA when there is one.

Weights come from a checkpoint directory or a hub repo (see `checkpoint`). Voice packs: the
registry's packaged voices, the checkpoint's `voices/`, then `--voices-dir`, later ones winning.

Several sessions keep the GPU busy at once: the scheduler runs up to `workers` segments in
parallel threads, and on CUDA each thread issues its kernels on a stream of its own, so one
segment's kernels overlap another's host-side work and launches instead of queueing behind them.

Progressive synthesis (`front`, `decode`): KModel's forward in two halves, by calling its
modules in the order `forward_with_tokens`, `Decoder.forward` and `Generator.forward` do. The
front pass runs everything up to the decoder's inputs (aligned features, F0 and N curves, the
style's decoder half, the durations) and the generator's harmonic source over the whole
segment (its sine phase is a cumulative sum over the segment, its initial phase and noise are
random, seeded per segment: `seeded`, so a request gives the same samples every time): so a
window's source is a slice of the segment's, no window restarts the phase, and decoding all of
a segment's frames gives the whole call's audio. Then, by `TorchOptions.decoder`:
- stream (the default): the onnx engine's exact streamed decoder (`streamed`) over KModel's
  own decoder: the body over the whole segment, the generator pushed in fixed blocks with every
  layer's state carried, its norms the voice's prior at the segment's length; on CUDA each
  worker queues its blocks on its own stream, on the CPU they run on one torch thread (with the
  resblocks in int8 where oneDNN has them);
- windows: the decoder over any window of frames with context, the STFT of the source
  included; its instance norms carry their statistics from window to window of a segment,
  starting from the voice's prior, as the onnx engine's windows do (`torch_norms`: each
  `AdaIN1d`'s norm replaced once at load; the prior computed once per voice over
  `carried_norms.CALIBRATION_PHONEMES` and kept in memory and in the cache directory); with
  nothing carried the decoder is kokoro's own.
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kokoro_contract import blends
from model_server.batching import Policy
from model_server.cuda_compat import DRIVER_FILE
from model_server.engines import checkpoint
from model_server.engines import voices as voice_packs
from model_server.engines.base import (
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
from model_server.engines.weights import default_cache_dir
from model_server.errors import ModelUnavailable, SynthesisCancelled, SynthesisFailed
from model_server.windows import Window

if TYPE_CHECKING:
    from model_server.engines.seeded import SeededSource
    from model_server.engines.streamed import Inputs, StreamedDecoder, StreamPriors
    from model_server.engines.torch_norms import Carried

log = logging.getLogger(__name__)

MIN_TORCH = (2, 10)  # older releases carry PYSEC-2026-2286


@dataclass(frozen=True)
class TorchOptions:
    model_dir: Path = checkpoint.SAGEMAKER_MODEL_DIR
    model_repo: str | None = None  # a hub repo id, instead of model_dir
    voices_dir: Path | None = None
    device: str = "auto"  # auto: cuda when available, else cpu
    threads: int = 0  # torch intra-op threads on the CPU; 0: torch's default
    cache_dir: Path | None = None  # where the voices' norm priors are kept
    # progressive synthesis: stream (exact, every layer's state carried; auto is stream) or
    # windows (with context, crossfaded, the norms carried)
    decoder: str = "auto"
    # the streamed decoder's steps of several segments run as one batch by this policy
    # (`batcher`); None: each alone
    batch: Policy | None = None


def torch_version_ok(version: str) -> bool:
    major, minor = (int(part) for part in version.split("+")[0].split(".")[:2])
    return (major, minor) >= MIN_TORCH


def _resolve_device(torch: Any, requested: str) -> Any:
    if requested == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if DRIVER_FILE.exists():
            log.warning("an NVIDIA driver is loaded but torch sees no CUDA device: using the CPU")
        return torch.device("cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelUnavailable(f"--device {requested}: torch sees no CUDA device")
    return device


@dataclass(frozen=True)
class Features:
    """A segment's front pass on the engine's device (`Front.features`): what the decoder needs
    for any window of its frames. Per frame: `asr` 1 column, `f0` and `n` 2, `harmonics`
    `frame_samples`."""

    asr: Any  # (1, hidden, frames): the text encoder's features, aligned to the frames
    f0: Any  # (1, 2 x frames): the F0 curve
    n: Any  # (1, 2 x frames): the energy curve
    style: Any  # (1, 128): the style's decoder half
    harmonics: Any  # (1, frames x frame_samples): the generator's harmonic source
    carry: Carry  # what the segment's windows carry from one to the next


@dataclass
class Carry:
    """What a segment's windows carry from one to the next: the voice's prior (None: none, each
    norm its window's own statistics), the norms' statistics of the cores decoded so far (None:
    none yet), and where the next core starts."""

    prior: Carried | None
    seen: Carried | None = None
    next_start: int = 0

    def carried(self, after: int) -> Carried | None:
        """The statistics a window with `after` frames of the segment after it is normalised
        by, beside its own core's (`carried_norms.carried_in`)."""
        return carried_in(self.prior, self.seen, after)


def frame_samples(config: dict[str, Any]) -> int:
    """Samples of audio per frame of `pred_dur`: the decoder upsamples 2x, the generator by its
    upsample rates, and its iSTFT hop makes samples (2 x 10 x 6 x 5 = 600 for Kokoro-82M)."""
    istft = config["istftnet"]
    return 2 * math.prod(int(r) for r in istft["upsample_rates"]) * int(istft["gen_istft_hop_size"])


class TorchEngine:
    name = "torch"
    two_passes = True
    voice_note = ""

    def __init__(self, options: TorchOptions) -> None:
        try:
            import torch
            from kokoro import KModel
        except ImportError as exc:
            raise ModelUnavailable(
                f"the torch engine needs the `torch` extra (kokoro, torch): {exc}"
            ) from exc
        if not torch_version_ok(torch.__version__):
            raise ModelUnavailable(
                f"torch {torch.__version__} is too old: {'.'.join(map(str, MIN_TORCH))} or newer "
                "is required (PYSEC-2026-2286)"
            )
        self._torch: Any = torch  # imported here: the onnx engine must not need it
        directory = (
            checkpoint.download(options.model_repo) if options.model_repo else options.model_dir
        )
        files = checkpoint.locate(directory)
        config = checkpoint.read_config(files.config)
        self._device = _resolve_device(torch, options.device)
        if self._device.type == "cpu" and options.threads:
            torch.set_num_threads(options.threads)
        self._model = self._load(KModel, config, files.weights, options.model_repo)
        from model_server.engines.seeded import seed_source

        cuda = [self._device.index or 0] if self._device.type == "cuda" else []
        self._source: SeededSource = seed_source(self._model.decoder.generator, cuda)
        self._priors: dict[str, NormStats] = {}
        self._carried: dict[str, Carried] = {}  # each loaded voice's prior, on the device
        self._carried_lock = threading.Lock()
        self._prior_lock = threading.Lock()  # one calibration at a time
        self._prior_dir = (options.cache_dir or default_cache_dir()) / "norm-priors"
        stat = files.weights.stat()
        self._prior_key = hashlib.sha256(  # the checkpoint: its config, its weights file
            files.config.read_bytes()
            + f"\n{files.weights.resolve()}\n{stat.st_size}\n{stat.st_mtime_ns}\n".encode()
        ).hexdigest()
        self.decoder = "windows" if options.decoder == "windows" else "stream"
        self._streamed: StreamedDecoder | None = None
        self._stream_priors: StreamPriors | None = None
        self._norms = 0
        if self.decoder == "stream":
            self._stream_decoder(options.threads, options.batch)
        else:
            from model_server.engines import torch_norms

            self._norms = torch_norms.carry_statistics(self._model.decoder)
        self._vocab: dict[str, int] = {str(k): int(v) for k, v in config["vocab"].items()}
        self.max_phonemes = int(self._model.context_length) - 2  # BOS and EOS pads
        self.frame_samples = frame_samples(config)

        packs, self._origin = voice_packs.load_voices(files.voices_dir, options.voices_dir)
        self._packs = voice_packs.Packs(  # name -> (N, 1, 256) tensor on the device; blends
            {
                name: torch.from_numpy(np.ascontiguousarray(pack)).to(self._device)
                for name, pack in packs.items()
            }
        )
        self._streams = threading.local()
        log.info(
            "torch engine: %s on %s (torch %s), progressive decoder %s, voices %s",
            files.weights,
            self._device,
            torch.__version__,
            self.decoder,
            ", ".join(self._packs),
        )

    def _stream_decoder(self, threads: int, batch: Policy | None) -> None:
        """The streamed decoder over KModel's own, and its priors by voice; its segments' steps
        batched by `batch` (None: each alone: on CUDA each worker queues its own on a stream of
        its own; with batches one thread queues them all)."""
        from model_server.engines import int8
        from model_server.engines.streamed import (
            CallingThread,
            StreamedDecoder,
            StreamPriors,
            runner,
        )

        cpu = self._device.type == "cpu"
        threads = threads or self._torch.get_num_threads()
        steps = runner(threads, batch) if cpu or batch is not None else CallingThread()
        self._streamed = StreamedDecoder(self._model.decoder, steps, int8=cpu and int8.available())
        self._stream_priors = StreamPriors(
            self._streamed,
            self._prior_dir,
            f"stream:{self._prior_key}",
            self._stream_inputs,
            self._pack_array,
        )

    def _load(self, kmodel: Any, config: dict[str, Any], weights: Path, repo: str | None) -> Any:
        torch = self._torch
        try:  # mapped, not read: this copy is only looked at; KModel reads its own
            state = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
        except Exception:
            try:  # the legacy (pre-zip) format cannot be mapped
                state = torch.load(weights, map_location="cpu", weights_only=True)
            except Exception as exc:
                raise ModelUnavailable(f"{weights}: not a torch checkpoint: {exc}") from exc
        checkpoint.check_structure(weights, state)
        try:
            # KModel loads the weights itself; it falls back to a partial load without a word,
            # so the checkpoint is checked against the built model's parameters below.
            with warnings.catch_warnings():  # kokoro builds its decoder with the old weight_norm
                warnings.filterwarnings("ignore", ".*weight_norm.* is deprecated", FutureWarning)
                model = kmodel(
                    repo_id=repo or "hexgrad/Kokoro-82M", config=config, model=str(weights)
                )
        except Exception as exc:  # size mismatches surface here
            raise ModelUnavailable(
                f"{weights.name} does not match {checkpoint.CONFIG_FILE}: {exc}"
            ) from exc
        expected = {
            component: {
                name: tuple(param.shape)
                for name, param in getattr(model, component).named_parameters()
            }
            for component in checkpoint.COMPONENTS
        }
        checkpoint.check_components(weights, state, expected)
        return model.to(self._device).eval()

    @property
    def description(self) -> str:
        device = self._device
        if device.type == "cuda":
            index = device.index or 0
            name = self._torch.cuda.get_device_name(index)
            return f"torch on cuda:{index} ({name}, decoder {self.decoder})"
        return f"torch on {device.type} (decoder {self.decoder})"

    def voices(self) -> dict[str, str]:
        return dict(self._origin)

    @contextmanager
    def _stream(self) -> Iterator[None]:
        """A CUDA stream per worker thread; nothing on the CPU."""
        if self._device.type != "cuda":
            yield
            return
        stream = getattr(self._streams, "stream", None)
        if stream is None:
            stream = self._streams.stream = self._torch.cuda.Stream(device=self._device)
        with self._torch.cuda.stream(stream):
            yield

    @contextmanager
    def _inference(self) -> Iterator[None]:
        """Where a call runs: no autograd, on this thread's stream."""
        with self._torch.inference_mode(), self._stream():
            yield

    def _seeded(self, tokens: list[int], voice: str, speed: float) -> Any:
        """The segment's harmonic source drawn from its own seed (`seeded`)."""
        from model_server.engines.seeded import segment_seed

        return self._source.seeded(segment_seed(tokens, voice, speed))

    def infer(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> FloatAudio:
        return self.infer_timed(phonemes, voice, speed, cancel).audio

    def infer_timed(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Timed:
        tokens = tokenize(phonemes, self._vocab, self.max_phonemes)
        if not tokens:
            return Timed(np.zeros(0, np.float32), np.zeros(len(phonemes) + 2, np.int64), 1)
        if cancel.cancelled:  # a running forward cannot be interrupted; a queued one can
            raise SynthesisCancelled()
        pack = self._packs[voice]
        try:
            with self._inference(), self._seeded(tokens, voice, speed):
                ids, style = self._inputs(tokens, pack)
                audio, pred_dur = self._model.forward_with_tokens(ids, style, speed)
                out = audio.float().cpu().numpy()  # waits for this thread's stream only
                frames = pred_dur.cpu().numpy()
        except Exception as exc:
            raise SynthesisFailed(f"torch failed: {exc}") from exc
        if cancel.cancelled:
            raise SynthesisCancelled()
        durations = char_durations(phonemes, self._vocab, frames)
        return Timed(out.ravel(), durations, self.frame_samples)

    def _inputs(self, tokens: list[int], pack: Any) -> tuple[Any, Any]:
        """The model's token ids (padded, on the device) and the voice pack's style row."""
        ids = self._torch.tensor([[0, *tokens, 0]], dtype=self._torch.long, device=self._device)
        return ids, pack[style_row(len(tokens), len(pack))]  # (1, 256)

    @property
    def exact_windows(self) -> bool:
        """Whether a segment's windows need no context and no crossfade: with the streamed
        decoder (`TorchOptions.decoder` stream)."""
        return self._streamed is not None

    def batch_curve(self) -> dict[str, float] | None:
        return None if self._streamed is None else self._streamed.thread.batch_curve()

    def front(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Front:
        if self._streamed is not None:
            return self._stream_front(phonemes, voice, speed, cancel)
        return self._front(phonemes, voice, speed, cancel, self._prior(voice))

    def _front_inputs(
        self, phonemes: str, voice: str, speed: float, cancel: CancelToken
    ) -> tuple[Inputs, Any] | None:
        """The front pass of a segment (seeded): the decoder's inputs and the frames per
        phoneme (`Timed.durations`); None when it has no tokens."""
        tokens = tokenize(phonemes, self._vocab, self.max_phonemes)
        if not tokens:
            return None
        if cancel.cancelled:
            raise SynthesisCancelled()
        pack = self._packs[voice]
        try:
            with self._inference(), self._seeded(tokens, voice, speed):
                ids, style = self._inputs(tokens, pack)
                inputs, pred_dur = _front_pass(self._model, ids, style, speed)
                # the last thing queued on this thread's stream: when it is here, the features
                # are computed too, and a window may be decoded on another thread's stream
                frames = pred_dur.cpu().numpy()
        except Exception as exc:
            raise SynthesisFailed(f"torch failed: {exc}") from exc
        if cancel.cancelled:
            raise SynthesisCancelled()
        if inputs.harmonics.shape[-1] != int(frames.sum()) * self.frame_samples:
            raise SynthesisFailed(
                f"a harmonic source of {inputs.harmonics.shape[-1]} samples for "
                f"{int(frames.sum())} frames"
            )
        return inputs, char_durations(phonemes, self._vocab, frames)

    def _stream_inputs(self, phonemes: str, voice: str) -> Inputs:
        """The streamed decoder's inputs for `phonemes` at speed 1 (the priors' calibration)."""
        found = self._front_inputs(phonemes, voice, 1.0, CancelToken())
        if found is None:
            raise SynthesisFailed(f"calibration phonemes without tokens in {voice}'s vocab")
        return found[0]

    def prepare_voice(self, voice: str, pause: Pause) -> bool:
        """`voice`'s norm priors made ahead of its first segment (`carried_norms.prepare_voice`)."""
        return prepare_voice(voice, pause, self._stream_priors, self._prior)

    def _stream_front(self, phonemes: str, voice: str, speed: float, cancel: CancelToken) -> Front:
        """A streamed segment: the front pass, then its stream opened (the body's pass)."""
        assert self._streamed is not None
        assert self._stream_priors is not None
        prior = self._stream_priors(voice)
        found = self._front_inputs(phonemes, voice, speed, cancel)
        if found is None:
            return Front(0, np.zeros(len(phonemes) + 2, np.int64), self.frame_samples, None)
        inputs, durations = found
        try:
            with self._inference():
                return self._streamed.front(durations, inputs, prior)
        except Exception as exc:
            raise SynthesisFailed(f"torch failed: {exc}") from exc

    def _pack_array(self, voice: str) -> Any:
        """`voice`'s pack as a numpy array (what keys its priors in the cache directory)."""
        return self._packs[voice].float().cpu().contiguous().numpy()

    def _front(
        self,
        phonemes: str,
        voice: str,
        speed: float,
        cancel: CancelToken,
        carried: Carried | None,
    ) -> Front:
        """The front pass, its windows starting from `carried` (None: each norm its window's
        own statistics; over the whole segment in one window, then, the whole call's audio)."""
        found = self._front_inputs(phonemes, voice, speed, cancel)
        if found is None:
            return Front(0, np.zeros(len(phonemes) + 2, np.int64), self.frame_samples, None)
        i, durations = found
        features = Features(i.asr, i.f0, i.n, i.style, i.harmonics, Carry(carried))
        return Front(i.frames, durations, self.frame_samples, features)

    def decode(self, front: Front, window: Window, cancel: CancelToken) -> FloatAudio:
        """The audio of `window.decoded`: the decoder's body over the frames `window.body` of
        the front pass's features, its generator over the frames `window.decoded` of the body's
        output and those samples of the harmonic source, each norm normalising by the
        segment's statistics so far (`torch_norms`), then carrying the core's on."""
        from model_server.engines.streamed import decode_body, decode_window
        from model_server.engines.torch_norms import Run, carrying

        if self._streamed is not None:
            try:
                with self._inference():
                    return decode_window(front, window, cancel)
            except (SynthesisCancelled, SynthesisFailed):
                raise
            except Exception as exc:
                raise SynthesisFailed(f"torch failed: {exc}") from exc
        check_window(window, front.frames)
        start, end = window.decoded
        body_start, body_end = window.body
        features = front.features
        if not isinstance(features, Features):
            raise SynthesisFailed(f"not a torch front pass: {type(features).__name__}")
        carry = features.carry
        if window.start != carry.next_start:
            raise SynthesisFailed(
                f"a window at frame {window.start}: this segment's next starts at "
                f"{carry.next_start} (its windows are decoded in order)"
            )
        if cancel.cancelled:
            raise SynthesisCancelled()
        n = front.frame_samples
        carried_in = carry.carried(front.frames - window.end)
        core_frames = window.end - window.start
        body_run = Run(
            carried_in, body_end - body_start, window.start - body_start, core_frames, self._norms
        )
        run = body_run.moved(end - start, window.left)  # the generator's norms
        try:
            with self._inference():
                with carrying(body_run):
                    x = decode_body(
                        self._model.decoder,
                        features.asr[:, :, body_start:body_end],
                        features.f0[:, 2 * body_start : 2 * body_end],
                        features.n[:, 2 * body_start : 2 * body_end],
                        features.style,
                    )
                with carrying(run):
                    audio = _generate(
                        self._model,
                        x[:, :, 2 * (start - body_start) : 2 * (end - body_start)],
                        features.style,
                        features.harmonics[:, start * n : end * n],
                        cancel,
                    )
                core = run.core()
                # queued before the audio's copy: when that is here, these are computed too
                seen = core if carry.seen is None else carry.seen.plus(core)
                out: FloatAudio = audio.float().cpu().numpy().ravel()  # waits for the stream
        except SynthesisCancelled:
            raise
        except Exception as exc:
            raise SynthesisFailed(f"torch failed: {exc}") from exc
        if cancel.cancelled:
            raise SynthesisCancelled()
        if out.size != (end - start) * n:
            raise SynthesisFailed(f"{out.size} samples for {end - start} frames")
        # replaced only now: the tensors carried in are no longer read by any queued kernel
        carry.seen = seen
        carry.next_start = window.end
        return out

    def _prior(self, voice: str) -> Carried:
        """The voice's instance-norm statistics over the reference text, weighing
        `PRIOR_FRAMES`, on the device (`_prior_stats`)."""
        if blends.is_blend(voice):  # made again each time: there is no end to blends
            return self._on_device(self._prior_stats(voice))
        with self._carried_lock:  # one copy per voice, whichever segment asks first
            known = self._carried.get(voice)
            if known is None:
                known = self._carried[voice] = self._on_device(self._prior_stats(voice))
            return known

    def _on_device(self, stats: NormStats) -> Carried:
        from model_server.engines.torch_norms import Carried

        prior = Carried.from_stats(stats, self._device)
        if self._device.type == "cuda":  # copied in before any stream's kernels read it
            self._torch.cuda.synchronize(self._device)
        return prior

    def _prior_stats(self, voice: str) -> NormStats:
        """`_prior`'s statistics: from memory, the cache directory, or computed (once per
        voice: one decoder pass over each sentence of the reference text); a blend's, its
        voices' (`blended_stats`)."""
        if blends.is_blend(voice):
            parts = blends.parse_blend(voice).shares
            return blended_stats([(self._prior_stats(name), share) for name, share in parts])
        with self._prior_lock:
            known = self._priors.get(voice)
            if known is not None:
                return known
            stats = voice_prior(
                self._prior_dir,
                voice,
                self._prior_key,
                self._pack_array(voice),
                self._norms,
                lambda: self._calibrate(voice).to_stats(),
            )
            prior = stats.scaled(PRIOR_FRAMES)
            self._priors[voice] = prior
            return prior

    def _calibrate(self, voice: str) -> Carried:
        """The statistics of every norm over the reference text, each sentence in one window
        (its harmonic source seeded as every segment's is: the same prior from run to run)."""
        total: Carried | None = None
        for phonemes in CALIBRATION_PHONEMES:
            cancel = CancelToken()
            front = self._front(phonemes, voice, 1.0, cancel, None)
            if not isinstance(front.features, Features):
                raise SynthesisFailed(f"the reference text has no frames in {voice}'s vocab")
            self.decode(front, Window(0, front.frames, 0, 0), cancel)
            seen = front.features.carry.seen
            assert seen is not None
            total = seen if total is None else total.plus(seen)
        assert total is not None
        return total


# KModel's forward in two halves. Each calls kokoro's modules in the order its forward does
# (kokoro 0.9.4: KModel.forward_with_tokens, Decoder.forward, Generator.forward), batch of one;
# tests/model_server/engines/test_torch_engine.py checks that the two in sequence give the whole
# call's audio.


def _front_pass(model: Any, ids: Any, ref_s: Any, speed: float) -> tuple[Inputs, Any]:
    """`forward_with_tokens` up to the decoder, and the generator's harmonic source: the
    decoder's inputs and the frames per token (`pred_dur`)."""
    import torch

    from model_server.engines.streamed import Inputs

    length = ids.shape[-1]
    lengths = torch.full((1,), length, device=ids.device, dtype=torch.long)
    text_mask = torch.zeros((1, length), dtype=torch.bool, device=ids.device)  # no padding
    bert_dur = model.bert(ids, attention_mask=(~text_mask).int())
    d_en = model.bert_encoder(bert_dur).transpose(-1, -2)
    s = ref_s[:, 128:]
    d = model.predictor.text_encoder(d_en, s, lengths, text_mask)
    x, _ = model.predictor.lstm(d)
    duration = model.predictor.duration_proj(x)
    duration = torch.sigmoid(duration).sum(axis=-1) / speed
    pred_dur = torch.round(duration).clamp(min=1).long().view(-1)
    indices = torch.repeat_interleave(torch.arange(length, device=ids.device), pred_dur)
    alignment = torch.zeros((length, indices.shape[0]), device=ids.device)
    alignment[indices, torch.arange(indices.shape[0], device=ids.device)] = 1
    alignment = alignment.unsqueeze(0)
    en = d.transpose(-1, -2) @ alignment
    f0, n = model.predictor.F0Ntrain(en, s)
    asr = model.text_encoder(ids, lengths, text_mask) @ alignment
    generator = model.decoder.generator
    upsampled = generator.f0_upsamp(f0[:, None]).transpose(1, 2)  # one F0 per sample
    harmonics, _noise, _uv = generator.m_source(upsampled)  # random: initial phase, noise
    source = harmonics.transpose(1, 2).squeeze(1)
    return Inputs(asr, f0, n, ref_s[:, :128], source), pred_dur


def _generate(model: Any, x: Any, s: Any, harmonics: Any, cancel: CancelToken) -> Any:
    """`Generator.forward` over the body's output `x`, the harmonic source given (less its
    source): audio of shape (1, 1, samples). Stops between its stages when `cancel` fires."""
    import torch
    import torch.nn.functional as F

    gen = model.decoder.generator
    spec, phase = gen.stft.transform(harmonics)
    har = torch.cat([spec, phase], dim=1)
    for i in range(gen.num_upsamples):
        if cancel.cancelled:
            raise SynthesisCancelled()
        x = F.leaky_relu(x, negative_slope=0.1)
        x_source = gen.noise_res[i](gen.noise_convs[i](har), s)
        x = gen.ups[i](x)
        if i == gen.num_upsamples - 1:
            x = gen.reflection_pad(x)
        x = x + x_source
        xs = gen.resblocks[i * gen.num_kernels](x, s)
        for j in range(1, gen.num_kernels):
            xs += gen.resblocks[i * gen.num_kernels + j](x, s)
        x = xs / gen.num_kernels
    x = gen.conv_post(F.leaky_relu(x))
    bins = gen.post_n_fft // 2 + 1
    return gen.stft.inverse(torch.exp(x[:, :bins, :]), torch.sin(x[:, bins:, :]))
