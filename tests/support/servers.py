"""Real uvicorn servers on loopback ports, each in its own thread and event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI


@dataclass
class RunningServer:
    app: FastAPI
    port: int
    server: uvicorn.Server
    internal_port: int | None = None  # a gateway's internal listener (/metrics)
    host: str = "127.0.0.1"  # (any loopback address: 127.0.0.2 for a second "machine")

    @property
    def internal_url(self) -> str:
        assert self.internal_port is not None, "not a gateway"
        return f"http://127.0.0.1:{self.internal_port}"

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}"


def free_port() -> int:
    """A port nothing listens on now (for servers started as processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _listening(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    # IPPROTO_TCP named: asyncio then sets TCP_NODELAY on accepted connections, as it does for
    # the sockets uvicorn makes itself (else each reused connection waits on delayed ACKs)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


@contextlib.contextmanager
def _serving(
    *apps: tuple[FastAPI, dict[str, Any]], host: str = "127.0.0.1", port: int = 0
) -> Iterator[list[tuple[uvicorn.Server, int]]]:
    """Bind first, then serve: connections made before uvicorn is up wait in the backlog, so
    nobody needs to poll for the port. Several apps share one thread and event loop (as the
    gateway's two listeners do in `gateway.cli`). Every app is served with the model server's
    options (`model_server.cli.server_options`: its connection timeouts), a gateway with its own."""
    from model_server.cli import server_options

    defaults = {
        "log_level": "warning",
        **server_options(),
        "lifespan": "on",
        "timeout_graceful_shutdown": 2,
    }
    socks = [_listening(host, port if i == 0 else 0) for i, _ in enumerate(apps)]
    servers = [uvicorn.Server(uvicorn.Config(app, **{**defaults, **opts})) for app, opts in apps]
    ports: list[int] = [sock.getsockname()[1] for sock in socks]

    async def run_all() -> None:
        await asyncio.gather(*(s.serve(sockets=[k]) for s, k in zip(servers, socks, strict=True)))

    thread = threading.Thread(target=lambda: asyncio.run(run_all()), name=f"uvicorn-{ports[0]}")
    thread.start()
    try:
        # its start-up (the lifespan: a gateway's AWS clients, a model server's engine) done,
        # so a test's first request is timed from when it is served, not from the import of a
        # library on a busy machine (polled: another thread's start has no event to wait on)
        deadline = time.monotonic() + 120
        while not all(server.started for server in servers) and thread.is_alive():
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server on port {ports[0]} did not start")
            time.sleep(0.01)
        yield list(zip(servers, ports, strict=True))
    finally:
        for server in servers:
            server.should_exit = True
        thread.join(timeout=30)
        for sock in socks:
            sock.close()


@contextlib.contextmanager
def serve(app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> Iterator[RunningServer]:
    """A gateway app is served as `gateway` serves it: the public listener with the same
    uvicorn options, and the internal one (`/metrics`) on a port of its own. `host` and
    `port` (0: any free one) are a model server's address."""
    internal = getattr(app.state, "internal", None)
    if internal is None:
        with _serving((app, {}), host=host, port=port) as [(server, bound)]:
            yield RunningServer(app, bound, server, host=host)
        return
    from gateway.cli import server_options

    options = {**server_options(app.state.service.settings), "log_level": "warning"}
    with _serving((app, options), (internal, {"lifespan": "off"})) as served:
        [(server, port), (_, internal_port)] = served
        yield RunningServer(app, port, server, internal_port)


@contextlib.contextmanager
def serve_real_model(settings: Any) -> Iterator[RunningServer]:
    """A model server with the real Kokoro-82M (`model_server.config.Settings`), served once it
    has loaded."""
    from model_server.app import create_app

    app = create_app(settings)
    with serve(app) as running:
        assert app.state.service.settled.wait(timeout=120), "model did not load"
        assert app.state.service.ready, app.state.service.failure
        yield running
