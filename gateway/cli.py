"""`gateway`: the browser-facing service."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import uvicorn

from gateway.app import create_app
from gateway.config import parse_settings


def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_settings(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    print(f"gateway: listening on http://{settings.host}:{settings.port}", flush=True)
    try:
        app = create_app(settings)
    except ValueError as exc:  # a setting that cannot work: say which, no traceback
        raise SystemExit(f"gateway: {exc}") from exc
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        ws="websockets-sansio",
        timeout_graceful_shutdown=10,
    )
