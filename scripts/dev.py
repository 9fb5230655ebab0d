"""`make dev`: the model server and the gateway together, until Ctrl-C.

Starts the model server, then the gateway once the model server listens (a model server that
cannot start says why and nothing else follows), waits until the model server's /ping and the
gateway's /readyz say ready, prints
the URL with the engine, device and default voice, and stops both cleanly (SIGTERM, as an
orchestrator would: a service still starting ends without a word; then SIGKILL after 15 s) on
Ctrl-C or if one exits. The model server picks its engine itself
(`--engine auto`: the torch engine on CUDA when a device and a Kokoro checkpoint are at hand,
else int8 ONNX on the CPU); `--model-args` (make's MODEL_ARGS) reaches the model server and
wins over that, the other arguments (DEV_ARGS) reach the gateway. A service that exits during
start-up (a bad flag, a missing checkpoint) stops `make dev` with its exit status.

`--fleet` (`make dev-fleet`): a fleet to try by hand, all on loopback: Debian's
`redis-server` (`make redis`) on `--redis-port`, and two gateways sharing it
(`GATEWAY_REDIS_URL`) on `--port` and the port after it, their internal listeners on 9101
and 9102, in front of the one model server.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent


class ServiceExited(SystemExit):
    pass


def wait_ready(
    url: str, procs: list[subprocess.Popen[bytes]], timeout: float = 600, listening: bool = False
) -> httpx.Response:
    """`url`'s answer once it is 200 (or any answer, when `listening`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if (status := p.poll()) is not None:
                print(
                    "dev: a service exited during start-up (see its message above)", file=sys.stderr
                )
                raise ServiceExited(status or 1)
        try:
            response = httpx.get(url, timeout=2)
            if response.status_code == 200 or listening:
                return response
        except httpx.HTTPError:
            pass
        time.sleep(0.5)  # a start-up poll for a human at a terminal, not a test
    raise SystemExit(f"dev: {url} not ready after {timeout:.0f} s")


def model_server_command(host: str, port: int, model_args: str) -> list[str]:
    """The model server's command line: --engine auto first, so MODEL_ARGS wins over it."""
    return [
        str(BIN / "model-server"),
        "--host",
        host,
        "--port",
        str(port),
        "--engine",
        "auto",
        *shlex.split(model_args),
    ]


def banner(gateway_url: str, model_url: str, ping: dict[str, object]) -> str:
    engine = ping.get("engine", "unknown engine")
    voice = ping.get("voice", "?")
    return (
        f"\n  ready: {gateway_url}  (model server {model_url}: engine {engine}, voice {voice}; "
        "Ctrl-C stops them)\n"
    )


def fleet_commands(
    gateway: list[str], port: int, redis_port: int
) -> tuple[list[str], list[list[str]], dict[str, str]]:
    """`redis-server` on loopback (nothing saved), two gateways on `port` and `port + 1` with
    internal listeners of their own, and the environment that gives them the Redis URL."""
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise SystemExit("dev: redis-server is not installed (make redis)")
    redis = [redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""]
    redis += ["--appendonly", "no"]
    gateways = [
        [*gateway, "--port", str(port + i), "--internal-port", str(9101 + i)] for i in (0, 1)
    ]
    env = {**os.environ, "GATEWAY_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0"}
    return redis, gateways, env


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
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
    parser.add_argument("--model-args", default="", help="flags for the model server (MODEL_ARGS)")
    parser.add_argument("--fleet", action="store_true", help="Redis and two gateways sharing it")
    parser.add_argument("--redis-port", type=int, default=6390)
    args, extra = parser.parse_known_args()
    model_url = f"http://{args.host}:{args.model_port}"
    # the demo page paces its text like an LLM (echo_tps): honoured on any interface here
    gateway = [str(BIN / "gateway"), "--host", args.host, "--echo-pacing", "true"]
    gateways = [[*gateway, "--port", str(args.port)]]
    env: dict[str, str] | None = None
    procs: list[subprocess.Popen[bytes]] = []
    if args.fleet:
        redis, gateways, env = fleet_commands(gateway, args.port, args.redis_port)
        procs.append(subprocess.Popen(redis))
    model_server = model_server_command(args.host, args.model_port, args.model_args)
    procs.append(subprocess.Popen(model_server))

    def on_term(*_: object) -> None:
        stop(procs)
        sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C, also when started from a shell that ignores SIGINT for background jobs
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        wait_ready(model_url + "/ping", procs, listening=True)  # 503 while the model loads
        for command in gateways:
            command += ["--model-server-url", model_url, *extra]
            procs.append(subprocess.Popen(command, env=env))
        ping = wait_ready(model_url + "/ping", procs).json()
        urls = [f"http://{args.host}:{args.port + i}" for i in range(len(gateways))]
        for url in urls:
            wait_ready(url + "/readyz", procs)
        print(banner(" and ".join(urls), model_url, ping), flush=True)
        while all(p.poll() is None for p in procs):
            time.sleep(0.5)
        print("dev: a service exited; stopping the other", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    finally:
        stop(procs)


if __name__ == "__main__":
    main()
