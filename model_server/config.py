"""The model server's settings: one object, from command-line flags or MODEL_SERVER_* variables."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kokoro_contract import limits
from kokoro_contract.markup import DEFAULT_MAX_PAUSE_S
from kokoro_contract.settings import parse_dataclass
from model_server.batching import Policy
from model_server.engines.checkpoint import SAGEMAKER_MODEL_DIR
from model_server.engines.hub_voices import MODES as ENGLISH_VOICES_MODES
from model_server.engines.registry import DECODERS, ENGINES
from model_server.scheduler import SCHEDULING

ENV_PREFIX = "MODEL_SERVER_"


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    engine: str = "onnx"
    voices_dir: Path | None = None
    # onnx: Kokoro's English packs from the Hugging Face hub, fetched once into its cache
    # (auto), or the registry's packs only (off; also what HF_HUB_OFFLINE=1 leaves uncached)
    english_voices: str = "auto"
    default_voice: str = ""  # empty: an English voice when one is loaded (af_heart first)
    model_path: Path | None = None
    cache_dir: Path | None = None
    model_dir: Path = SAGEMAKER_MODEL_DIR
    model_repo: str | None = None
    device: str = "auto"
    workers: int = 2  # engine calls running at once, across all sessions
    scheduling: str = "edf"  # edf: earliest deadline first; fair: round-robin by session
    # voice each segment window by window (engines that can): first audio early, whatever the
    # sentence's length; as intelligible as one call since the norms' statistics are carried
    # (docs/measured.md, "Progressive synthesis")
    progressive: bool = True
    decoder: str = "auto"  # progressive: stream (exact), windows, auto (stream with torch)
    # the streamed decoder's steps of several segments as one batched call (`batcher`): off by
    # default, as on the project's 2-core CPUs it does not pay (docs/measured.md, "Batched
    # decoder steps"); made for a GPU, where a step's fixed cost is most of it
    batch: bool = False
    batch_window_ms: float = 4.0  # how long a due step may wait for others to join it
    threads: int = 0  # onnxruntime intra-op threads per call; 0: all cores
    decoder_threads: int = 0  # onnx: the streamed decoder's torch threads; 0: as --threads
    max_text_chars: int = limits.MAX_TEXT_CHARS
    max_pause_s: float = DEFAULT_MAX_PAUSE_S  # a markup pause longer: 400 pause_too_long
    max_pending: int = 32  # queued + running requests per WebSocket session
    max_body_bytes: int = 1_048_576  # an HTTP request's body: 413 body_too_large past it
    max_sessions: int = 256  # bidi WebSocket sessions at once (a gateway's --max-sessions)
    idle_timeout_s: float = 300.0  # a session with nothing pending, silent this long: closed
    watchdog_s: float = 60.0  # an engine call running longer: /ping fails (0: no watchdog)
    invocation_timeout_s: float = 60.0  # SageMaker's limit on one non-streamed invocation
    warmup: bool = True
    prepare_voices: bool = True  # every voice's norm priors made in the background when idle
    api_key: str = ""  # every route but /ping needs it (the gateways' --model-server-key)
    allow_anonymous: bool = False  # beyond loopback without a key (SageMaker's serve: IAM)
    log_level: str = "info"

    @property
    def batch_policy(self) -> Policy | None:
        """How the engines batch their decoder steps (`--batch`; None: off)."""
        return Policy(window_s=self.batch_window_ms / 1000) if self.batch else None

    @property
    def engine_threads(self) -> int:
        """Threads of an engine call that runs alone: all cores (the fastest first audio)."""
        return self.threads or (os.cpu_count() or 1)

    @property
    def shared_threads(self) -> int:
        """Threads of a call that starts beside another: the cores split between the workers.
        Two calls side by side, each on its share of the cores, make more audio per second than
        two calls that each take all the cores and oversubscribe them (docs/measured.md, "Model
        server (`make bench-model`)")."""
        if self.threads:
            return self.threads
        return max(1, (os.cpu_count() or 1) // max(1, self.workers))


_HELP = {
    "host": "interface to listen on",
    "port": "port to listen on",
    "engine": "synthesis engine: onnx (int8, CPU), torch (kokoro's KModel, CUDA or CPU), or auto "
    "(torch on CUDA when a device and a Kokoro checkpoint are at hand, else onnx)",
    "voices_dir": "directory of extra voice packs (.pt, .npy, .npz, .bin)",
    "english_voices": "onnx: auto: add Kokoro's English voice packs (af_heart, ...) from the "
    "Hugging Face hub (hexgrad/Kokoro-82M voices/a*, b*), fetched once into its cache and read "
    "from there after (HF_ENDPOINT, HF_HUB_CACHE, HF_HUB_OFFLINE apply); hub unreachable, "
    "offline or off: the registry's packs only, as the ready line says",
    "default_voice": "voice used when a request names none (empty: af_heart or another English "
    "voice when one is loaded, else jm_kumo)",
    "model_path": "onnx: the Kokoro ONNX model file (default: assembled from the registry "
    "packages)",
    "cache_dir": "onnx: where the model is assembled; both engines: where the voices' "
    "instance-norm priors are kept (default: ~/.cache/kokoro-voice-stream)",
    "model_dir": "torch: a Kokoro checkpoint directory: config.json, one .pth, voices/*.pt "
    "(SageMaker unpacks the model data into /opt/ml/model)",
    "model_repo": "torch: a Hugging Face repo id (e.g. hexgrad/Kokoro-82M) instead of --model-dir; "
    "needs the hub or its cache",
    "device": "torch: cuda, cuda:N or cpu (auto: cuda when available)",
    "workers": "engine calls running at once, across all sessions",
    "scheduling": "edf: the segment whose audio is needed first goes next; fair: round-robin "
    "by session (the policy before deadlines)",
    "progressive": "on: voice each segment in windows of frames after one front pass, each "
    "window's audio sent as soon as it is decoded (first audio early, whatever the sentence's "
    "length); off: one engine call per segment, its audio sent when all of it is computed",
    "decoder": "progressive: stream: the decoder carries every layer's state from block to "
    "block (onnx: torch with the registry graph's weights, the generator's resblocks in int8, "
    "the torch extra; torch: KModel's decoder): a segment's samples do not depend on its "
    "windows or the machine's speed, no seams, heard as one call; windows: each window decoded "
    "with context, joined by crossfades (onnx: no torch needed); auto: stream where torch and "
    "kokoro are installed, else windows (docs/measured.md)",
    "batch": "on: the streamed decoder's steps that are due from several segments run as one "
    "batched call, each segment's samples bit for bit those it gets alone (earliest deadline "
    "first; the time per batch size is learned and reported in GET /load's batch_curve); off: "
    "each segment's steps alone (the default: on a CPU of few cores batches do not pay; "
    "docs/measured.md)",
    "batch_window_ms": "how long a due decoder step may wait for other segments' to join its "
    "batch, while others are decoding and never past its deadline (0: only what is due at "
    "once)",
    "threads": "CPU threads per engine call (0: all cores for onnx, torch's default for torch)",
    "decoder_threads": "onnx: CPU threads of the streamed decoder (torch's, one thread for every "
    "segment's steps; 0: as --threads). 1 keeps its speed when other work takes a core",
    "max_text_chars": "longest text accepted in one request",
    "max_pause_s": "longest pause markup may ask for ([pause:1.5s], SSML <break time>): a longer "
    "one is 400 pause_too_long",
    "max_pending": "requests queued or running per WebSocket session",
    "max_body_bytes": "largest HTTP request body (413 body_too_large)",
    "max_sessions": "bidirectional WebSocket sessions open at once; one more gets an error "
    "frame too_many_sessions and is closed with 1013 (try again later) (0: no limit)",
    "idle_timeout_s": "a bidirectional WebSocket session with nothing queued or running that "
    "sends no message for this long gets an error frame idle_timeout and is closed with 1000 "
    "(0: never)",
    "watchdog_s": "an engine call still running after this long means a wedged worker: /ping "
    "and /load answer 503 stuck, so the platform replaces the container and gateways route "
    "elsewhere (0: no watchdog)",
    "invocation_timeout_s": "a non-streamed POST /invocations whose synthesis is estimated to "
    "take longer is refused up front (413 synthesis_too_long: stream it instead); SageMaker "
    "gives one invocation 60 s (0: no limit)",
    "warmup": "run one synthesis before /ping reports ready",
    "prepare_voices": "once ready, make each loaded voice's instance-norm priors in the "
    "background, a whole call at a time while no synthesis has run for a second (else a "
    "voice's first request waits for them: about 15 s on a CPU, once per voice and --cache-dir)",
    "api_key": "a key of at least 16 characters shared with the gateways (their "
    "--model-server-key): every route but /ping then needs 'Authorization: Bearer <key>'",
    "allow_anonymous": "serve beyond loopback without --api-key (serve, SageMaker's entry, says "
    "it: IAM fronts the endpoint)",
    "log_level": "logging level",
}


def parse_settings(
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: object,
) -> Settings:
    """Flags win over MODEL_SERVER_* variables, which win over the defaults."""
    return parse_dataclass(
        Settings,
        prog="model-server",
        description="Kokoro-82M TTS behind the SageMaker container contract",
        env_prefix=ENV_PREFIX,
        help=_HELP,
        choices={
            "engine": [*ENGINES, "auto"],
            "scheduling": list(SCHEDULING),
            "decoder": ["auto", *DECODERS],
            "english_voices": list(ENGLISH_VOICES_MODES),
        },
        argv=argv,
        env=env,
        overrides=overrides,
    )
