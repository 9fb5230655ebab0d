"""The gateway's service, in three parts: the runtime (`runtime`: clients, transports, the
model-server pool, their start and stop), the gate (`gate`: sessions, rates, admission, drain,
what each reply holds until it ends) and the reply factory (`replies`: text sources, chunk
plans over the shared learned speeds, encoders). A reply's lifecycle joins them in one place,
`speak` (`gateway.service.speak`): the routes only adapt the wire,
`async with speak(service, client, params, ...) as speech: async for event in speech: ...`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.access.keys import KeyRing
from gateway.config import Settings
from gateway.metrics import GatewayMetrics
from gateway.service.gate import Gate
from gateway.service.replies import ReplyFactory
from gateway.service.runtime import Runtime


def load_keys(settings: Settings) -> KeyRing | None:
    """The API keys from `--api-keys-file` and `--api-keys` together; None when neither."""
    lines = [k for k in settings.api_keys.split(",") if k.strip()]
    if settings.api_keys_file:
        try:
            with open(settings.api_keys_file, encoding="utf-8") as f:
                lines += f.read().splitlines()
        except OSError as exc:
            raise ValueError(f"cannot read --api-keys-file: {exc.strerror}") from exc
        if not any(line.strip() and not line.lstrip().startswith("#") for line in lines):
            raise ValueError(f"--api-keys-file {settings.api_keys_file} holds no key")
    return KeyRing.parse(lines) if lines else None


class GatewayService:
    def __init__(self, settings: Settings, sagemaker_http2_transport: Any = None) -> None:
        """`sagemaker_http2_transport` replaces the HTTP/2 SDK's CRT client (tests)."""
        self.settings = settings
        self.metrics = GatewayMetrics()
        self.keys = load_keys(settings)
        self.wall_clock: Callable[[], float] = time.time  # token expiry
        self.runtime = Runtime(settings, sagemaker_http2_transport)
        self.gate = Gate(settings, self.metrics, self.runtime)
        self.replies = ReplyFactory(settings, self.metrics, self.runtime)

    async def start(self) -> None:
        await self.runtime.start()
        await self.gate.start_fleet()

    async def aclose(self) -> None:
        await self.gate.aclose()
        await self.runtime.aclose()

    async def drain(self, timeout_s: float) -> int:
        return await self.gate.drain(timeout_s)


__all__ = ["GatewayService", "load_keys"]
