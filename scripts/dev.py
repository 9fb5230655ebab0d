"""`make dev`: the model server and the gateway together, until Ctrl-C.

Starts both, waits until the model server's /ping and the gateway's /readyz say ready, prints
the URL, and stops both cleanly (SIGINT, then SIGKILL after 15 s) on Ctrl-C or if one exits.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


def wait_ready(url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise SystemExit("dev: a service exited during start-up (see its log above)")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # a start-up poll for a human at a terminal, not a test
    raise SystemExit(f"dev: {url} not ready after {timeout:.0f} s")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGINT)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model-port", type=int, default=8080)
    parser.add_argument("--port", type=int, default=8000)
    args, extra = parser.parse_known_args()
    model_url = f"http://{args.host}:{args.model_port}"
    gateway_url = f"http://{args.host}:{args.port}"
    procs = [
        subprocess.Popen(
            [BIN / "model-server", "--host", args.host, "--port", str(args.model_port)]
        ),
        subprocess.Popen(
            [
                BIN / "gateway",
                "--host",
                args.host,
                "--port",
                str(args.port),
                "--model-server-url",
                model_url,
                *extra,
            ]
        ),
    ]

    def on_term(*_: object) -> None:
        stop(procs)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C, also when started from a shell that ignores SIGINT for background jobs
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        wait_ready(model_url + "/ping", procs)
        wait_ready(gateway_url + "/readyz", procs)
        print(
            f"\n  ready: {gateway_url}  (model server {model_url}; Ctrl-C stops both)\n", flush=True
        )
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("dev: a service exited; stopping the other", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
