"""Console scripts: `model-server` (flags) and `serve` (what SageMaker runs: 0.0.0.0:8080)."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from typing import Any

import uvicorn

from kokoro_contract import connections, listen, logs
from model_server import cuda_compat
from model_server.access import check_listening
from model_server.app import create_app
from model_server.config import Settings, parse_settings
from model_server.detect import detect
from model_server.engine_choice import choose_engine
from model_server.engines.registry import engine_kind
from model_server.errors import ModelUnavailable


def preflight(settings: Settings) -> None:
    """Fail at once, saying what to install or pass, rather than after binding the port."""
    engine_kind(settings.engine).preflight(settings)


def resolve_engine(settings: Settings) -> Settings:
    """`--engine auto`: the engine this machine can run best (`engine_choice`); said once."""
    if settings.engine != "auto":
        return settings
    choice = choose_engine("auto", detect(settings.model_dir))
    print(f"model-server: engine {choice.engine} ({choice.reason})", flush=True)
    if choice.engine == "onnx":
        return dataclasses.replace(settings, engine="onnx")
    return dataclasses.replace(
        settings,
        engine="torch",
        device="cuda",
        model_dir=choice.model_dir or settings.model_dir,
        model_repo=choice.model_repo,
    )


def run(settings: Settings) -> None:
    logs.configure(settings.log_level)
    settings = resolve_engine(settings)
    try:
        check_listening(settings.host, settings.api_key, settings.allow_anonymous)
        settings.batch_policy  # noqa: B018 (a batch window out of range: refused here)
        preflight(settings)
        sock = listen.bind(settings.host, settings.port, "--port")
    except (ValueError, ModelUnavailable, listen.CannotListen) as exc:
        print(f"model-server: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(
        f"model-server: listening on http://{settings.host}:{settings.port} "
        f"(ws://{settings.host}:{settings.port}/invocations-bidirectional-stream)",
        flush=True,
    )
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=25,  # SageMaker sends SIGKILL 30 s after SIGTERM
        **server_options(),
    )
    quiet_probes()
    uvicorn.Server(config).run(sockets=[sock])


def server_options() -> dict[str, Any]:
    """uvicorn's options for the listener (the tests serve with the same ones): the shared
    connection timeouts (a request head within 10 s, a body within 30 s, 5 s idle between
    requests), no `Server` header, WebSocket refusals that are not errors."""
    return connections.uvicorn_options(connections.ConnectionTimeouts())


def quiet_probes() -> None:
    """uvicorn's access log (configured by `uvicorn.Config`): `/ping` and `/load` only when
    their answer changes (SageMaker and the gateways ask every few seconds)."""
    logging.getLogger("uvicorn.access").addFilter(logs.ProbeFilter({"/ping", "/load"}))


def main(argv: Sequence[str] | None = None) -> None:
    run(parse_settings(argv))


def serve(argv: Sequence[str] | None = None) -> None:
    """SageMaker starts the container with `docker run IMAGE serve`: listen on 0.0.0.0:8080."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        args = args[1:]
    settings = parse_settings(args, host="0.0.0.0", port=8080, allow_anonymous=True)
    if settings.engine != "auto" and engine_kind(settings.engine).cuda and argv is None:
        cuda_compat.restart_if_needed()  # before anything loads libcuda
    run(settings)
