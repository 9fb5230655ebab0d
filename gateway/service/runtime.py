"""What the gateway runs on: the HTTP clients (the model servers', the LLM's: each with only
its own credentials), the model-server pool or the SageMaker transports, the AWS clients, and
their start and stop."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import httpx
from aiobotocore.session import get_session

from gateway.config import Settings
from gateway.fleet.asks import FleetAsks
from gateway.fleet.store import Store
from gateway.retry import RetryPolicy
from gateway.routing.pool import ModelServerPool
from gateway.transports.base import BatchTransport, SessionTransport
from gateway.transports.sagemaker_bidi import SageMakerBidiTransport
from gateway.transports.sagemaker_stream import SageMakerStreamTransport


class Runtime:
    def __init__(self, settings: Settings, sagemaker_http2_transport: Any = None) -> None:
        """`sagemaker_http2_transport` replaces the HTTP/2 SDK's CRT client (tests)."""
        self.settings = settings
        key = settings.model_server_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}  # the model servers' key
        # Each outbound client carries only its own credentials: `client` (the model servers:
        # synthesis, voices) and the pool's probe client (/load, /ping, through each server's
        # transport) their key; `llm_client` (an OpenAI-compatible LLM) none by
        # default, the source adding --openai-api-key to its own requests; the AWS clients
        # their SDK's credential chain. One connection per session at most, waited for at
        # most 5 s (then a clean error).
        timeout = httpx.Timeout(30.0, connect=5.0, pool=5.0)
        limits = httpx.Limits(
            max_connections=settings.max_sessions + 16,
            max_keepalive_connections=min(64, settings.max_sessions),
        )
        self.client = httpx.AsyncClient(headers=headers, timeout=timeout, limits=limits)
        self.llm_client = httpx.AsyncClient(timeout=timeout, limits=limits)
        self.retry = RetryPolicy(attempts=max(1, settings.retry_attempts))
        self.pool: ModelServerPool | None = None
        # one botocore session for every AWS client: one credential chain, refreshed in one place
        self.aws_session = get_session()
        self.bidi: SessionTransport  # SageMaker's (the pool gives each reply its own)
        self.batch: BatchTransport
        if settings.tts_transport == "sagemaker":
            if not settings.sagemaker_endpoint:
                raise ValueError(
                    "--tts-transport sagemaker needs --sagemaker-endpoint "
                    "(GATEWAY_SAGEMAKER_ENDPOINT)"
                )
            self.bidi = SageMakerBidiTransport(
                settings.sagemaker_endpoint,
                self.aws_region(),
                settings.sagemaker_http2_endpoint_uri or None,
                sagemaker_http2_transport,
                settings.tts_timeout_s,
                self.aws_session,
            )
        else:
            urls = [u.strip() for u in settings.model_server_url.split(",") if u.strip()]
            self.pool = ModelServerPool(
                urls,
                self.client,
                httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(0.5)),
                tts_timeout_s=settings.tts_timeout_s,
                stall_timeout_s=settings.stall_timeout_s or None,
                first_slack_s=settings.first_slack_s,
            )
        # a fleet's shared store (limits, sessions); None: this gateway counts alone
        self.store: Store | None = None
        if settings.redis_url:
            self.store = Store(
                settings.redis_url,
                prefix=settings.redis_prefix,
                timeout_s=settings.redis_timeout_s,
            )
        # admission across the fleet: what the other gateways' replies ask of each server
        self.fleet_asks: FleetAsks | None = None
        if self.store is not None and self.pool is not None:
            self.fleet_asks = self.pool.others = FleetAsks(self.store)
        self._exits = contextlib.AsyncExitStack()
        self.bedrock: Any = None  # an aioboto3 bedrock-runtime client, for --llm bedrock

    def aws_region(self) -> str:
        region = (
            self.settings.aws_region
            or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
        )
        if not region:
            raise ValueError(
                "SageMaker needs a region: --aws-region (GATEWAY_AWS_REGION) or AWS_REGION"
            )
        return region

    async def start(self) -> None:
        import aioboto3
        from botocore.config import Config

        if self.store is not None:
            await self.store.start()
            self._exits.push_async_callback(self.store.aclose)
        if self.fleet_asks is not None and self.pool is not None:
            await self.fleet_asks.start(self.pool.asks)
            self._exits.push_async_callback(self.fleet_asks.aclose)
        # Retries happen above the SDK, only where nothing was said yet (gateway.retry); a
        # connection per session, waited for at most 5 s
        config = Config(
            retries={"total_max_attempts": 1},
            connect_timeout=5,
            read_timeout=60,
            max_pool_connections=self.settings.max_sessions,
        )
        region = self.settings.aws_region or None
        session = aioboto3.Session(botocore_session=self.aws_session)
        if self.settings.llm == "bedrock":
            self.bedrock = await self._exits.enter_async_context(
                session.client("bedrock-runtime", region_name=region, config=config)
            )
        if self.settings.tts_transport == "sagemaker":
            runtime = await self._exits.enter_async_context(
                session.client("sagemaker-runtime", region_name=self.aws_region(), config=config)
            )
            self.batch = SageMakerStreamTransport(runtime, self.settings.sagemaker_endpoint)
            assert isinstance(self.bidi, SageMakerBidiTransport)
            self._exits.push_async_callback(self.bidi.close)

    async def aclose(self) -> None:
        await self._exits.aclose()
        if self.pool is not None:
            await self.pool.aclose()
        await self.client.aclose()
        await self.llm_client.aclose()

    async def tts_ready(self) -> tuple[bool, str]:
        """(ready, what) for /readyz: the model server answers /ping; a SageMaker endpoint is
        not probed (that needs the control-plane API), only configured."""
        if self.pool is not None:
            return await self.pool.ready(), self.settings.model_server_url
        return True, f"sagemaker:{self.settings.sagemaker_endpoint}"

    async def voices(self) -> dict[str, Any]:
        if self.pool is not None:
            return await self.pool.voices()
        return {"default": self.settings.default_voice, "voices": []}
