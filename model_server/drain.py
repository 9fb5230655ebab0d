"""`model-server-drain`: the Kubernetes preStop hook of the model server.

By the time the hook runs the pod is leaving the Service's endpoints, so no new work arrives;
the hook waits until /ping reports nothing in flight (or `--timeout` passes), then returns and
the container gets SIGTERM with no session left to cut off.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import httpx


def wait_drained(url: str, timeout_s: float, interval_s: float = 0.5) -> int:
    """Poll `url`/ping until nothing is in flight; returns what is still in flight (0: drained).
    A server that no longer answers has nothing in flight."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(base_url=url, timeout=2.0) as client:
        while True:
            try:
                inflight = int(client.get("/ping").json().get("inflight", 0))
            except (httpx.HTTPError, ValueError, TypeError):
                return 0
            if inflight == 0 or time.monotonic() >= deadline:
                return inflight
            time.sleep(interval_s)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="model-server-drain", description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--timeout", type=float, default=40.0, help="seconds to wait at most")
    args = parser.parse_args(argv)
    left = wait_drained(args.url, args.timeout)
    if left:
        print(
            f"model-server-drain: {left} still in flight after {args.timeout:g} s", file=sys.stderr
        )
    sys.exit(0)  # never fail the hook: Kubernetes sends SIGTERM either way
