"""`make bench-faults`: how fast the stack recovers, on the real model, as separate processes.

1. **Restart.** A model server is killed (SIGKILL) mid-reply and started again on its port:
   the seconds from its `/ping` answering 200 to the gateway's next reply served to the end
   (replies asked back to back, every 0.1 s), and what the refused ones were told.
2. **Freeze, one server.** The model server is frozen (SIGSTOP) once the listener of a long
   reply has received `--after-audio-s` of audio, the gateway at `--tts-timeout-s 4`
   (as the issue found it): the seconds from the freeze to the error, its code, and how much
   of the audio received was still to play then (more than 0: the error came first).
3. **Freeze, two servers.** The same with two model servers (the gateway's defaults): the
   seconds from the freeze to the next audio (the reply resumed on the other), whether it
   ended without an error, and the audio heard against the same reply heard whole.

No thresholds: the figures, printed as measured (`--runs N`: each case N times).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import orjson

from bench.harness import BIN, BYTES_PER_SECOND, error_code
from gateway.sources.sse import SSEDecoder
from scripts.dev import stop, wait_ready
from tests.support.servers import free_port

LONG = "This reply keeps talking for a while, sentence after sentence. " * 8
PACED = {"text": LONG, "format": "pcm", "echo_tps": "40"}


@contextlib.contextmanager
def model_server(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """The real model server (int8 ONNX) on `port`, ready; stopped on the way out."""
    command = [str(BIN / "model-server"), "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_ready(f"http://127.0.0.1:{port}/ping", [proc], timeout=300)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGCONT)
        stop([proc])


@contextlib.contextmanager
def gateway(ports: list[int], *flags: str) -> Iterator[str]:
    port = free_port()
    urls = ",".join(f"http://127.0.0.1:{p}" for p in ports)
    command = [str(BIN / "gateway"), "--port", str(port), "--internal-port", "0"]
    command += ["--model-server-url", urls, "--log-level", "warning", *flags]
    proc = subprocess.Popen(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_ready(f"http://127.0.0.1:{port}/readyz", [proc], timeout=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop([proc])


@dataclass
class Heard:
    """A reply as a listener hears it, from the moment it was asked."""

    first_audio_s: float | None = None
    audio_s: float = 0.0
    fault_s: float | None = None  # when the fault was made
    after_fault_s: float | None = None  # the first audio after it
    error: str | None = None
    error_s: float | None = None
    buffered_s: float | None = None  # audio received but not yet played when the error came
    unplayed_at_fault_s: float | None = None  # and when the fault was made


async def hear(
    base: str,
    params: dict[str, str],
    fault: Callable[[], None] | None = None,
    after_audio_s: float = 0.0,
) -> Heard:
    """One SSE reply; `fault()` once the listener has received `after_audio_s` of audio."""
    heard = Heard()
    started = time.perf_counter()
    async with (
        httpx.AsyncClient(base_url=base, timeout=180) as http,
        http.stream("GET", "/v1/speak/sse", params=params) as r,
    ):
        if r.status_code != 200:
            heard.error = error_code(await r.aread()) or f"HTTP {r.status_code}"
            return heard
        decoder = SSEDecoder()
        async for raw in r.aiter_raw():
            now = time.perf_counter() - started
            for event in decoder.push(raw):
                if event.event == "error" and heard.error is None:
                    heard.error, heard.error_s = error_code(event.data), now
                    if heard.first_audio_s is not None:
                        heard.buffered_s = heard.first_audio_s + heard.audio_s - now
                if event.event != "audio_chunk":
                    continue
                data = base64.b64decode(orjson.loads(event.data)["data"])
                if heard.first_audio_s is None:
                    heard.first_audio_s = now
                elif heard.fault_s is not None and heard.after_fault_s is None:
                    heard.after_fault_s = now
                heard.audio_s += len(data) / BYTES_PER_SECOND
                if fault is not None and heard.fault_s is None and heard.audio_s >= after_audio_s:
                    fault()
                    heard.fault_s = time.perf_counter() - started
                    heard.unplayed_at_fault_s = heard.first_audio_s + heard.audio_s - now
    return heard


async def restart_case() -> tuple[float, int, dict[str, int]]:
    """(seconds from /ping 200 to the next served reply, replies asked, refusals by code)."""
    port = free_port()
    server = model_server(port)
    proc = server.__enter__()
    try:
        with gateway([port]) as base:
            await hear(base, {"text": "Warm up, please.", "format": "pcm"})
            killed = await hear(base, PACED, lambda: proc.kill())
            assert killed.error is not None, "the killed server's reply ended without an error"
            server.__exit__(None, None, None)
            with model_server(port):
                ping_at = time.perf_counter()  # model_server() returns once /ping says 200
                asked, codes = 0, dict[str, int]()
                while True:
                    asked += 1
                    reply = await hear(base, {"text": "Hello again.", "format": "pcm"})
                    if reply.error is None and reply.audio_s > 0:
                        return time.perf_counter() - ping_at, asked, codes
                    codes[reply.error or "no audio"] = codes.get(reply.error or "no audio", 0) + 1
                    await asyncio.sleep(0.1)
    finally:
        with contextlib.suppress(Exception):
            server.__exit__(None, None, None)


async def freeze_case(servers: int, after_audio_s: float, *flags: str) -> tuple[Heard, Heard]:
    """The reply heard whole, then with its server frozen."""
    ports = [free_port() for _ in range(servers)]
    with contextlib.ExitStack() as stack:
        procs = [stack.enter_context(model_server(p)) for p in ports]
        base = stack.enter_context(gateway(ports, *flags))
        for _ in range(servers):
            await hear(base, {"text": "Warm up, please.", "format": "pcm"})

        def freeze() -> None:
            for port, proc in zip(ports, procs, strict=True):
                ping = httpx.get(f"http://127.0.0.1:{port}/ping", timeout=2).json()
                if ping["inflight"]:  # the one serving this reply
                    os.kill(proc.pid, signal.SIGSTOP)
                    return

        whole = await hear(base, PACED)
        return whole, await hear(base, PACED, freeze, after_audio_s)


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"median {statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


async def main(runs: int, after_audio_s: float) -> None:
    restarts = []
    for _ in range(runs):
        seconds, asked, codes = await restart_case()
        restarts.append(seconds)
        print(f"restart: served {seconds:.2f} s after /ping 200 ({asked} asked; refused {codes})")
    alone, pair = [], []
    for _ in range(runs):
        _, one = await freeze_case(1, after_audio_s, "--tts-timeout-s", "4")
        assert one.fault_s is not None
        if one.error_s is not None:
            alone.append(one.error_s - one.fault_s)
        print(
            f"freeze, one server: {one.error} {spread(alone[-1:])} s after the freeze, "
            f"the listener's unplayed audio {one.unplayed_at_fault_s or 0:.2f} s at the freeze, "
            f"{one.buffered_s or 0:.2f} s at the error"
        )
        whole, two = await freeze_case(2, after_audio_s)
        assert two.fault_s is not None
        if two.after_fault_s is not None:
            pair.append(two.after_fault_s - two.fault_s)
        print(
            f"freeze, two servers: next audio {spread(pair[-1:])} s after the freeze, "
            f"error {two.error}, {two.audio_s:.3f} s of audio heard against "
            f"{whole.audio_s:.3f} s unfrozen"
        )
    print("\nrestart, /ping 200 -> next served reply (s):", spread(restarts))
    print("freeze, one server, freeze -> retryable error (s):", spread(alone))
    print("freeze, two servers, freeze -> resumed audio (s):", spread(pair))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--after-audio-s", type=float, default=4.0)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.after_audio_s))
    sys.exit(0)
