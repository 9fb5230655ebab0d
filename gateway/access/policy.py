"""Who may use the gateway, pure: one request's facts in, the client it is or why it is refused.

Checked for every HTTP request and WebSocket upgrade before any route runs:
- the Host header against the configured names (on loopback without names: loopback names
  only, so a DNS-rebinding page cannot reach a local gateway; beyond loopback the names must
  be given), except on the health probes;
- the Origin of browser requests against `--allowed-origins` (plus the page's own origin, the
  same scheme and host, and `localhost` origins while listening on loopback); a browser request
  from another site that carries no Origin (an `<img>` pointing at `/v1/speak/sse`) is refused
  by its Sec-Fetch-Site;
- on `POST /v1/*`, the body's type (JSON only: a cross-site form or `text/plain` post is
  refused before it can start a paid reply) and its declared size;
- credentials on `/v1/*`: `Authorization: Bearer <key or token>`, or `?token=` (EventSource
  and browser WebSockets cannot set headers; keys never go in URLs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gateway.access.keys import AuthError, Client, KeyRing, bearer, looks_like_token

LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$")
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
PROTECTED_PREFIX = "/v1/"
PROTECTED_PATHS = frozenset({"/invocations", "/ws"})  # the AgentCore contract's (routes/agentcore)
PROBES = frozenset(
    {"/healthz", "/readyz", "/ping"}
)  # answered whatever the Host: they tell nothing
JSON_TYPES = frozenset({"application/json"})
CROSS_SITE = frozenset({"cross-site", "same-site"})  # Sec-Fetch-Site values


@dataclass(frozen=True)
class Denial:
    status: int
    code: str
    message: str


@dataclass(frozen=True)
class RequestFacts:
    method: str  # "WEBSOCKET" for an upgrade
    path: str
    headers: Mapping[str, str]  # lower-case names
    query_token: str | None
    address: str | None  # the peer's IP address
    scheme: str = "http"  # "http" or "https" (a WebSocket's ws/wss as its page's)


# host[:port], the host a name or an IPv4 address, or an IPv6 address in brackets, and nothing
# else: `[::1]evil.example` or `localhost:80:80` is no host of ours
_HOST_HEADER = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\[\]:@/\\\s]*)(?::[0-9]{1,5})?")


def host_name(host_header: str) -> str:
    """`example.com:8000` -> `example.com`; `[::1]:8000` -> `[::1]`; a Host that is not
    exactly host[:port] -> "" (which is no configured name)."""
    match = _HOST_HEADER.fullmatch(host_header)
    return match.group(1) if match else ""


@dataclass(frozen=True)
class AccessPolicy:
    keys: KeyRing | None  # None: anonymous (loopback, or --allow-anonymous)
    origins: frozenset[str] = frozenset()
    local_origins: bool = True  # localhost origins allowed (listening on loopback)
    hosts: frozenset[str] = frozenset()  # Host names accepted; empty: any
    max_body_bytes: int = 65_536
    max_lexicon_bytes: int = 1_048_576  # a lexicon's PUT: thousands of entries

    def body_limit(self, path: str) -> int:
        """The largest body a request to `path` may send."""
        return self.max_lexicon_bytes if path.startswith("/v1/lexicons/") else self.max_body_bytes

    def check(self, request: RequestFacts, now: float) -> Client | Denial:
        host = request.headers.get("host", "")
        probe = request.path in PROBES  # kubelets and load balancers ask by address
        if self.hosts and not probe and host_name(host).lower() not in self.hosts:
            return Denial(400, "host_not_allowed", "this Host is not served here")
        if not request.path.startswith(PROTECTED_PREFIX) and request.path not in PROTECTED_PATHS:
            return Client("anonymous", via="anonymous")
        origin = request.headers.get("origin")
        if origin is not None and not self.origin_allowed(origin, request.scheme, host):
            return Denial(403, "origin_not_allowed", f"origin {origin!r} is not allowed")
        if origin is None and request.headers.get("sec-fetch-site") in CROSS_SITE:
            # an <img>, <script> or link from another site: browsers send no Origin for those
            return Denial(403, "origin_not_allowed", "cross-site requests need an allowed Origin")
        if request.method in ("POST", "PUT"):
            denial = self._body(request.headers, self.body_limit(request.path))
            if denial is not None:
                return denial
        client = self.client(request, now)
        if isinstance(client, Client) and not client.may_call(request.path):
            return Denial(
                403, "token_not_for_route", f"this token may call: {', '.join(client.routes)}"
            )
        return client

    def origin_allowed(self, origin: str, scheme: str, host: str) -> bool:
        origin = origin.rstrip("/")
        if origin in self.origins or (self.local_origins and LOCAL_ORIGIN.match(origin)):
            return True
        return origin.lower() == f"{scheme}://{host}".lower()  # the page this gateway served

    def _body(self, headers: Mapping[str, str], limit: int) -> Denial | None:
        media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type not in JSON_TYPES:
            return Denial(415, "unsupported_media_type", "send the body as application/json")
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            return Denial(413, "body_too_large", f"bodies are limited to {limit} bytes")
        return None

    def client(self, request: RequestFacts, now: float) -> Client | Denial:
        if self.keys is None:
            return Client(f"ip:{request.address or 'unknown'}", via="anonymous")
        try:
            credential = bearer(request.headers.get("authorization"))
            if credential is not None:
                return self._by_credential(credential, now)
            if request.query_token:
                return self.keys.by_token(request.query_token, now)
        except AuthError as exc:
            return Denial(401, "unauthorized", f"{exc}")
        return Denial(
            401,
            "unauthorized",
            "this gateway needs credentials: 'Authorization: Bearer <API key>', or "
            "'?token=' with a token from POST /v1/tokens",
        )

    def _by_credential(self, credential: str, now: float) -> Client:
        assert self.keys is not None
        try:
            return self.keys.by_key(credential)
        except AuthError:
            if not looks_like_token(credential):
                raise
        return self.keys.by_token(credential, now)
