"""Services as processes of their own, for faults a thread cannot show: SIGKILL, SIGSTOP,
SIGTERM. `python -m tests.support.processes fake-model-server --port N` serves the model
server's real app over the fast fake engine."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def wait_http(url: str, procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 60) -> None:
    """Until `url` answers 200 (a process starting has no event to wait on: it is polled)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args!r} exited with {p.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(url)


@contextlib.contextmanager
def running(
    args: Sequence[str], ready_url: str, env: Mapping[str, str] | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A process, ready once `ready_url` answers; stopped (and reaped) on the way out."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=full_env)
    try:
        wait_http(ready_url, [proc])
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)  # a frozen one cannot stop
            proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def fake_model_server(port: int) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    args = ["-m", "tests.support.processes", "fake-model-server", "--port", str(port)]
    return running(args, f"http://127.0.0.1:{port}/ping")


def gateway_process(
    port: int,
    model_server_url: str,
    flags: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> contextlib.AbstractContextManager[subprocess.Popen[bytes]]:
    """The `gateway` command, as deployed (its signal handling included); `env`: GATEWAY_*
    settings beside the process's own environment."""
    args = [
        *("-c", "from gateway.cli import main; main()"),
        *("--port", str(port), "--internal-port", "0"),
        *("--model-server-url", model_server_url, "--log-level", "warning"),
        *flags,
    ]
    return running(args, f"http://127.0.0.1:{port}/readyz", env)


def _serve_fake_model_server(port: int) -> None:
    import uvicorn

    from model_server.app import create_app
    from model_server.cli import server_options
    from tests.conftest import FAKE_SETTINGS
    from tests.support.fakes import FakeEngine, identity_g2p

    engine = FakeEngine()
    app = create_app(FAKE_SETTINGS, engine_factory=lambda _: engine, g2p_factory=identity_g2p)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", **server_options())


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["fake-model-server"])
    parser.add_argument("--port", type=int, required=True)
    _serve_fake_model_server(parser.parse_args().port)
