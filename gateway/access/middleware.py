"""The ASGI edge of `access`: applies the policy to every request and WebSocket upgrade, reads
POST bodies up to their limit, and writes one structured log line per request (method, path,
status, time, client name, and the code of a refusal: never the query string or the body,
which carry prompts and tokens).

A refused WebSocket upgrade is answered with an HTTP status before it is accepted (the ASGI
denial-response extension), so browsers and SDKs see 401/403 rather than a closed socket; its
line here is the only one (uvicorn's own is dropped: `kokoro_contract.logs.QueryFilter`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from urllib.parse import parse_qsl

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.access.keys import Client
from gateway.access.policy import PROBES, AccessPolicy, Denial, RequestFacts
from kokoro_contract import asgi_deny
from kokoro_contract.logs import ProbeFilter

log = logging.getLogger("gateway.access.policy")


def client_of(scope: Scope) -> Client:
    """The client the policy let in (set on every request that reached a route)."""
    client: Client = scope["state"]["client"]
    return client


def _facts(scope: Scope) -> RequestFacts:
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
    peer = scope.get("client")
    scheme = str(scope.get("scheme") or "http")
    return RequestFacts(
        method="WEBSOCKET" if scope["type"] == "websocket" else scope["method"],
        path=scope["path"],
        headers=headers,
        query_token=query.get("token"),
        address=peer[0] if peer else None,
        scheme={"ws": "http", "wss": "https"}.get(scheme, scheme),
    )


async def deny(scope: Scope, receive: Receive, send: Send, denial: Denial) -> None:
    await asgi_deny.deny(
        scope, receive, send, denial.status, denial.code, denial.message, realm="gateway"
    )


class AccessMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        policy: AccessPolicy,
        on_denied: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.policy = policy
        self.on_denied = on_denied
        self.clock = clock
        self.probes = ProbeFilter(PROBES)  # kubelets, load balancers: logged when answers turn

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = [0]
        refused = [""]  # the code of a refusal here, for the log line
        facts = _facts(scope)
        verdict = self.policy.check(facts, self.clock())
        try:
            if isinstance(verdict, Denial):
                self.on_denied(verdict.code)
                status[0] = verdict.status
                refused[0] = verdict.code
                await deny(scope, receive, send, verdict)
                return
            scope.setdefault("state", {})["client"] = verdict
            if facts.method in ("POST", "PUT") and scope["type"] == "http":
                receive = await self._read_body(scope, receive, send, status)
                if status[0]:  # refused: too large
                    refused[0] = "body_too_large"
                    return
            await self.app(scope, receive, self._watch(send, status))
        finally:
            client = verdict.name if not isinstance(verdict, Denial) else "-"
            if self.probes.worth_logging(facts.path, status[0]):
                log.info(
                    "%s %s %d %.0fms client=%s%s",
                    facts.method,
                    facts.path,
                    status[0],
                    (time.perf_counter() - started) * 1000,
                    "anonymous" if client.startswith("ip:") else client,
                    f" refused={refused[0]}" if refused[0] else "",
                )

    async def _read_body(
        self, scope: Scope, receive: Receive, send: Send, status: list[int]
    ) -> Receive:
        """The whole body, refused past the limit (a declared length was checked already;
        this counts what a chunked body really sends); the app then reads it from memory."""
        limit = self.policy.body_limit(scope["path"])
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return receive  # the client left: let the app see it
            size += len(message.get("body", b""))
            if size > limit:
                denial = Denial(413, "body_too_large", f"bodies are limited to {limit} bytes")
                self.on_denied(denial.code)
                status[0] = denial.status
                await deny(scope, receive, send, denial)
                return receive
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        return replay

    @staticmethod
    def _watch(send: Send, status: list[int]) -> Send:
        async def watched(message: Message) -> None:
            if message["type"] in ("http.response.start", "websocket.http.response.start"):
                status[0] = message["status"]
            elif message["type"] == "websocket.accept":
                status[0] = 101
            await send(message)

        return watched
