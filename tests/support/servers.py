"""Real uvicorn servers on loopback ports, each in its own thread and event loop."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI


@dataclass
class RunningServer:
    app: FastAPI
    port: int
    server: uvicorn.Server

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"


def free_port() -> int:
    """A port nothing listens on now (for servers started as processes)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def serve(app: FastAPI) -> Iterator[RunningServer]:
    """Bind first, then serve: connections made before uvicorn is up wait in the backlog, so
    nobody needs to poll for the port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", ws="websockets-sansio", lifespan="on", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name=f"uvicorn-{port}"
    )
    thread.start()
    try:
        yield RunningServer(app, port, server)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
