"""What the load benchmarks share: the real stack as separate processes on free ports, and one
simulated reply heard through the gateway's SSE route (`make bench-load`, `make soak`)."""

from __future__ import annotations

import base64
import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import orjson

from bench.bench_gateway import ANSWER, FIRST_MS, TPS
from gateway.sources.sse import SSEDecoder
from scripts.dev import stop, wait_ready
from tests.support.servers import free_port

BYTES_PER_SECOND = 48_000  # s16le 24 kHz mono
GAP_TOLERANCE_S = 0.010
BIN = Path(sys.executable).parent


@dataclass
class ReplyResult:
    refused: bool = False
    retry_after_s: float = 0.0
    error: str | None = None
    first_audio_s: float | None = None
    audio_s: float = 0.0
    gap_s: float = 0.0
    gaps: int = 0
    last_audio_s: float = 0.0  # request to the last chunk
    play_end_s: float = 0.0  # request to the end of playback
    status: int = 0  # the HTTP status
    code: str | None = None  # the error code of a refusal, an error answer or an error event
    message: str | None = None  # a refusal's message
    refused_after_s: float = 0.0  # how long the refusal took (it may have waited for room)
    hung_up: bool = False  # the client closed the stream after the first audio
    arrivals: list[tuple[float, float]] = field(default_factory=list)  # (since request, audio s)
    chunks: list[tuple[float, float]] = field(default_factory=list)  # (sent ms, audio s), agent_end

    def timeline(self) -> str:
        """One line: the chunks the gateway sent (when, how long each plays) and each audio
        arrival against the moment the listener needed it (a `+` is a gap)."""
        sent = " ".join(f"{ms / 1000:.2f}:{audio:.1f}" for ms, audio in self.chunks)
        heard, play_end, marks = 0.0, 0.0, []
        for at, seconds in self.arrivals:
            if heard == 0.0:
                play_end = at
            late = at - play_end
            marks.append(f"{at:.2f}{'+' + format(late, '.2f') if late > GAP_TOLERANCE_S else ''}")
            play_end = max(play_end, at) + seconds
            heard += seconds
        return f"chunks sent@s:plays_s [{sent}]  audio arrived@s [{' '.join(marks)}]"


@dataclass
class Listener:
    """A listener who starts playing at the first audio: when playback ends, and the gaps (any
    moment the audio received so far has run out before the next arrives)."""

    result: ReplyResult
    play_end: float = 0.0  # since the request

    def heard(self, now: float, seconds: float) -> None:
        """`seconds` of audio arrived `now` (since the request)."""
        result = self.result
        if result.first_audio_s is None:
            result.first_audio_s = now
            self.play_end = now
        elif now > self.play_end + GAP_TOLERANCE_S:
            result.gaps += 1
            result.gap_s += now - self.play_end
            self.play_end = now
        else:
            self.play_end = max(self.play_end, now)
        self.play_end += seconds
        result.audio_s += seconds
        result.last_audio_s = now


def error_code(body: bytes | str, field: str = "code") -> str | None:
    """`code` (or another `field`) of an `{"error": {"code"}}` answer or of an SSE error
    event; None otherwise."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("error"), dict):
        obj = obj["error"]
    value = obj.get(field) if isinstance(obj, dict) else None
    return value if isinstance(value, str) else None


def paced_answer(mode: str) -> dict[str, object]:
    """The demo's 5-sentence answer from the echo source, paced like an LLM, as PCM."""
    return {
        "text": ANSWER,
        "format": "pcm",
        "mode": mode,
        "echo_tps": TPS,
        "echo_first_ms": FIRST_MS,
    }


async def one_reply(http: httpx.AsyncClient, mode: str, hang_up: bool = False) -> ReplyResult:
    """One paced reply over `POST /v1/speak`, timed as a listener hears it; `hang_up`: close
    the stream (the connection) at the first audio, as a browser tab that goes away."""
    result = ReplyResult()
    try:
        await _hear(http, mode, hang_up, result)
    except httpx.TransportError as exc:  # the connection broke: this reply's error, not the run's
        result.error = f"connection: {type(exc).__name__} {exc}"
    return result


async def _hear(http: httpx.AsyncClient, mode: str, hang_up: bool, result: ReplyResult) -> None:
    started = time.perf_counter()
    async with http.stream("POST", "/v1/speak", json=paced_answer(mode)) as response:
        result.status = response.status_code
        if response.status_code == 503:
            body = await response.aread()
            result.code = error_code(body)
            result.message = error_code(body, "message")
            result.refused_after_s = time.perf_counter() - started
            result.refused = True
            result.retry_after_s = float(response.headers.get("retry-after", "1"))
            return
        if response.status_code != 200:
            body = await response.aread()
            result.code = error_code(body)
            result.error = f"HTTP {response.status_code}: {body[:200]!r}"
            return
        decoder = SSEDecoder()
        listener = Listener(result)
        async for raw in response.aiter_raw():
            now = time.perf_counter() - started
            for event in decoder.push(raw):
                if event.event == "error":
                    result.error = event.data
                    result.code = error_code(event.data)
                if event.event == "agent_end":
                    metrics = orjson.loads(event.data).get("metrics", {})
                    sent = metrics.get("chunk_times_ms", [])
                    plays = metrics.get("chunk_audio_s", [])  # one per completed chunk
                    result.chunks = list(zip(sent, plays, strict=False))
                if event.event != "audio_chunk":
                    continue
                seconds = len(base64.b64decode(orjson.loads(event.data)["data"])) / BYTES_PER_SECOND
                listener.heard(now, seconds)
                result.arrivals.append((now, seconds))
            if hang_up and result.first_audio_s is not None:
                result.hung_up = True
                break  # leaving `stream` closes the connection mid-body
        result.play_end_s = listener.play_end


@dataclass(frozen=True)
class Stack:
    model_server: str
    gateway: str
    gateway_internal: str | None = None  # the gateway's /metrics listener, when asked for
    logs: dict[str, Path] = field(default_factory=dict)  # service -> its output, when kept
    procs: tuple[subprocess.Popen[bytes], ...] = ()
    gateways: tuple[str, ...] = ()  # every gateway, the first `gateway`
    internals: tuple[str, ...] = ()  # their /metrics listeners, when asked for


def cpu_seconds(proc: subprocess.Popen[bytes]) -> float:
    """The CPU time a process has used so far (user and system, all its threads; Linux's
    /proc), or nan where it cannot be read."""
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def stack(
    model_flags: list[str],
    gateway_flags: list[str],
    *,
    internal_port: int = 0,
    log_dir: Path | None = None,
    model_command: list[str] | None = None,
    gateways: int = 1,
    gateway_env: Mapping[str, str] | None = None,
) -> Iterator[Stack]:
    """A model server and a gateway in front of it, each its own process, on free ports.
    `model_command`: what runs as the model server (default `model-server`; the load
    benchmark's `--simulate-gpu` gives `bench.sim_engine`), with the same flags.

    `internal_port`: the gateway's internal listener (/metrics) there; 0, none (the default
    port would take 9101 from a `make dev`). `log_dir`: each service's output goes to
    `<service>.log` there instead of this terminal. `gateways`: that many, alike, in front of
    the one model server (the second and later with internal listeners on free ports when the
    first has one); `gateway_env`: GATEWAY_* settings for them (a fleet's Redis)."""
    model_port = free_port()
    model_url = f"http://127.0.0.1:{model_port}"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    logs: dict[str, Path] = {}
    files: list[IO[bytes]] = []

    def output(name: str) -> IO[bytes] | None:
        if log_dir is None:
            return None
        logs[name] = log_dir / f"{name}.log"
        files.append(logs[name].open("wb"))
        return files[-1]

    procs: list[subprocess.Popen[bytes]] = []
    try:
        out = output("model-server")
        procs.append(
            subprocess.Popen(
                [
                    *(model_command or [str(BIN / "model-server")]),
                    "--port",
                    str(model_port),
                    "--log-level",
                    "warning",
                    *model_flags,
                ],
                env=env,
                stdout=out,
                stderr=out,
            )
        )
        wait_ready(model_url + "/ping", procs)
        bases: list[str] = []
        internals: list[str] = []
        for i in range(gateways):
            port = free_port()
            internal = internal_port if i == 0 else (free_port() if internal_port else 0)
            out = output("gateway" if i == 0 else f"gateway-{i + 1}")
            procs.append(
                subprocess.Popen(
                    [
                        BIN / "gateway",
                        "--port",
                        str(port),
                        "--model-server-url",
                        model_url,
                        "--log-level",
                        "warning",
                        "--internal-port",
                        str(internal),
                        *gateway_flags,
                    ],
                    env={**env, **(gateway_env or {})},
                    stdout=out,
                    stderr=out,
                )
            )
            bases.append(f"http://127.0.0.1:{port}")
            if internal:
                internals.append(f"http://127.0.0.1:{internal}")
        for base in bases:
            wait_ready(base + "/readyz", procs)
        yield Stack(
            model_url,
            bases[0],
            internals[0] if internals else None,
            logs,
            tuple(procs),
            tuple(bases),
            tuple(internals),
        )
    finally:
        stop(procs)
        for f in files:
            f.close()
