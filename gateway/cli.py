"""`gateway`: the browser-facing service, and its internal listener beside it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Generator, Sequence
from typing import Any

import uvicorn
from fastapi import FastAPI

from gateway.app import create_app
from gateway.config import Settings, parse_settings
from gateway.service import GatewayService
from kokoro_contract import connections, listen, logs

log = logging.getLogger(__name__)


def connection_timeouts(settings: Settings) -> connections.ConnectionTimeouts:
    """ValueError, naming the flag, for a timeout that is not positive."""
    for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
        if not getattr(settings, name) > 0:
            raise ValueError(f"--{name.replace('_', '-')} must be more than 0")
    return connections.ConnectionTimeouts(
        header_s=settings.header_timeout_s,
        body_s=settings.body_timeout_s,
        keepalive_s=settings.keepalive_timeout_s,
    )


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the public listener (the tests serve with the same ones): the
    connection timeouts, no `Server` header, WebSocket refusals that are not errors."""
    return {
        **connections.uvicorn_options(connection_timeouts(settings)),
        "ws_max_size": settings.max_message_bytes,  # larger messages: closed with 1009
        "access_log": False,  # `gateway.access.policy` logs requests without query strings
        "log_level": settings.log_level,
    }


class PublicServer(uvicorn.Server):
    """On SIGTERM: stop accepting, let the sessions in progress end (replies finish, WebSockets
    close with 1012 once idle) for up to `--drain-timeout-s`, then uvicorn's own shutdown."""

    def __init__(self, config: uvicorn.Config, service: GatewayService) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:
            server.close()  # no new connections; the load balancer sends them elsewhere
        left = await self.service.drain(self.service.settings.drain_timeout_s)
        if left:
            log.warning("%d sessions still open after the drain timeout: closing them", left)
        await super().shutdown(sockets)


class InternalServer(uvicorn.Server):
    """The internal listener: the public server alone takes the process's signals, and this
    one stops when it does."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None]:
        yield


def bind_listeners(settings: Settings) -> list[socket.socket]:
    """The public socket and, when there is one, the internal listener's, bound before either
    serves (`kokoro_contract.listen.CannotListen` names a port in use and its flag)."""
    sockets = [listen.bind(settings.host, settings.port, "--port")]
    if settings.internal_port:
        try:
            sockets.append(
                listen.bind(settings.internal_host, settings.internal_port, "--internal-port")
            )
        except listen.CannotListen:
            sockets[0].close()
            raise
    return sockets


async def serve(app: FastAPI, settings: Settings, sockets: list[socket.socket]) -> None:
    public = PublicServer(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            timeout_graceful_shutdown=5,  # after the drain: what is left is cut
            **server_options(settings),
        ),
        app.state.service,
    )
    if not settings.internal_port:
        await public.serve(sockets[:1])
        return
    internal = InternalServer(
        uvicorn.Config(
            app.state.internal,
            host=settings.internal_host,
            port=settings.internal_port,
            lifespan="off",
            access_log=False,
            log_level=settings.log_level,
            **connections.uvicorn_options(connection_timeouts(settings)),
        )
    )
    serving = asyncio.create_task(internal.serve(sockets[1:]))
    try:
        await public.serve(sockets[:1])
    finally:
        internal.should_exit = True
        await serving


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    logs.configure(settings.log_level)
    try:
        app = create_app(settings)  # a setting that cannot work: say which, no traceback
        connection_timeouts(settings)
        sockets = bind_listeners(settings)
    except (ValueError, listen.CannotListen) as exc:
        print(f"gateway: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    print(f"gateway: listening on http://{settings.host}:{settings.port}", flush=True)
    if settings.internal_port:
        where = f"http://{settings.internal_host}:{settings.internal_port}"
        print(f"gateway: /metrics and /readyz details on {where}", flush=True)
    try:
        asyncio.run(serve(app, settings, sockets))
    except KeyboardInterrupt:  # Ctrl-C: uvicorn has shut down already and passes it on
        raise SystemExit(130) from None
