"""boto3 clients behind botocore's Stubber (each request checked against the service model),
and every call made through them in order, across clients, as (service, operation)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import boto3
from botocore.stub import Stubber


class StubbedClients:
    def __init__(self, services: Iterable[str]) -> None:
        self.order: list[tuple[str, str]] = []
        self.stubs: dict[str, Stubber] = {}
        self.clients: dict[str, Any] = {}
        for service in services:
            client = boto3.client(
                service,
                region_name="us-east-1",
                aws_access_key_id="AKIDEXAMPLE",
                aws_secret_access_key="secret",
            )
            client.meta.events.register(
                "before-parameter-build.*.*",
                lambda model, _s=service, **_: self.order.append((_s, model.name)),
            )
            self.clients[service] = client
            self.stubs[service] = Stubber(client)
            self.stubs[service].activate()

    def done(self) -> None:
        """Every response queued was asked for."""
        for stub in self.stubs.values():
            stub.assert_no_pending_responses()
