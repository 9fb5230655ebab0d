"""The HTTP/2 SDK's identity resolver over botocore's credential chain.

The SageMaker HTTP/2 SDK's own default chain (smithy-aws-core 0.12) knows environment
variables, shared config and credential_process only, so on AWS compute (instance metadata,
ECS/Fargate container credentials, EKS web identity or Pod Identity) it finds nothing. This
resolver asks the same botocore session the gateway's aioboto3 clients use: every provider
botocore has, and refreshing credentials refreshed before they expire (botocore's advisory and
mandatory windows), on every request the SDK signs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from smithy_aws_core.identity import AWSCredentialsIdentity, AWSIdentityProperties
from smithy_core.exceptions import SmithyIdentityError


class BotocoreIdentityResolver:
    def __init__(self, session: Any) -> None:
        self._session = session  # an aiobotocore session
        self._credentials: Any = None
        self._lock = asyncio.Lock()

    async def get_identity(self, *, properties: AWSIdentityProperties) -> AWSCredentialsIdentity:
        async with self._lock:
            if self._credentials is None:
                self._credentials = await self._session.get_credentials()
            credentials = self._credentials
        if credentials is None:
            raise SmithyIdentityError("no AWS credentials found by the SDK's default chain")
        frozen = await credentials.get_frozen_credentials()  # refreshes first when due
        return AWSCredentialsIdentity(
            access_key_id=frozen.access_key,
            secret_access_key=frozen.secret_key,
            session_token=frozen.token,
        )

    async def invalidate(self) -> None:
        async with self._lock:
            self._credentials = None
