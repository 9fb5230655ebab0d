"""API keys and the short-lived tokens minted from them, pure (the clock is a parameter).

Keys come one per line (a file) or comma-separated (an environment variable), each `name:key`
or a bare key, which is named `key-N` by its line (never by anything derived from the secret:
names land in logs and metrics). A token is `<payload>.<signature>`, both base64url without
padding: the payload is JSON `{"sub": key name, "exp": unix seconds, "routes": [...],
"subject": visitor}`, the signature HMAC-SHA256 of the payload under a key derived from the
named key itself. So a token dies with its key: rotating one key (a new secret under the same
name) revokes that key's tokens and no other's, and replicas sharing the key file accept each
other's tokens without any other secret. A token calls only the route groups it names
(`TOKEN_ROUTES`). Its `subject` says which of the key's visitors holds it (the page's own
visitor id, `SUBJECT`): sessions, rates and cancels count per subject within the key's own
caps. A token minted before subjects has none and counts under its key alone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import orjson

from kokoro_contract.limits import MIN_KEY_CHARS

TOKEN_CONTEXT = b"kokoro-gateway token v1"
MAX_TOKEN_TTL_S = 3600
# What a token may be bound to: route groups by path (POST /v1/tokens itself never: a token
# cannot mint tokens). A browser page needs the speak routes and the voice list.
TOKEN_ROUTES = {
    "speak": ("/v1/speak",),  # POST /v1/speak, /v1/speak/sse, /v1/speak/ws
    "speech": ("/v1/audio/speech",),
    "voices": ("/v1/voices",),
    "agentcore": ("/invocations", "/ws"),  # the AgentCore Runtime contract's routes
}
DEFAULT_TOKEN_ROUTES = ("speak", "voices")
SUBJECT = re.compile(r"[A-Za-z0-9._:@-]{1,64}")  # a token's subject: short, printable, no spaces


def route_group(path: str) -> str | None:
    """The `TOKEN_ROUTES` group a path belongs to, if any."""
    for group, prefixes in TOKEN_ROUTES.items():
        if any(path == p or path.startswith(p + "/") for p in prefixes):
            return group
    return None


class AuthError(Exception):
    """Credentials that do not let the request in; the message says why, without secrets."""


@dataclass(frozen=True)
class Client:
    """Who a request is: a key's name, or an address when anonymous (quotas count per client),
    and for a token, the visitor it was minted for (`subject`) and when it expires."""

    name: str
    via: str = "key"  # "key", "token" or "anonymous"
    routes: tuple[str, ...] = field(default=(), compare=False)  # a token's route groups
    subject: str | None = field(default=None, compare=False)  # a token's visitor
    expires: int | None = field(default=None, compare=False)  # a token's end, unix seconds

    @property
    def holder(self) -> str:
        """Whose quotas and replies these are: the key's name, or `name subject` for a token's
        visitor (neither a key's name nor a subject holds a space)."""
        return self.name if self.subject is None else f"{self.name} {self.subject}"

    def may_call(self, path: str) -> bool:
        """A key or an anonymous client calls every route; a token, only its groups'."""
        return self.via != "token" or route_group(path) in self.routes

    @property
    def anonymous(self) -> bool:
        return self.via == "anonymous"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class KeyRing:
    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        """`entries`: (name, key) pairs; names and keys must be unique."""
        self._by_digest: dict[bytes, str] = {}
        self._signing: dict[str, bytes] = {}
        for name, key in entries:
            if len(key) < MIN_KEY_CHARS:
                raise ValueError(f"API key {name!r} is shorter than {MIN_KEY_CHARS} characters")
            if name in self._signing or _digest(key) in self._by_digest:
                raise ValueError(f"API key {name!r} is given twice")
            self._by_digest[_digest(key)] = name
            self._signing[name] = hmac.new(key.encode(), TOKEN_CONTEXT, hashlib.sha256).digest()

    @classmethod
    def parse(cls, lines: Iterable[str]) -> KeyRing:
        """`name:key` or bare keys; blank lines and `#` comments are skipped."""
        entries = []
        for number, raw in enumerate(lines, start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, sep, key = line.partition(":")
            if not sep:
                name, key = f"key-{number}", line
            name, key = name.strip(), key.strip()
            if not name or not name.isascii() or not name.isprintable() or " " in name:
                raise ValueError("an API key's name must be printable ASCII without spaces")
            entries.append((name, key))
        return cls(entries)

    def __len__(self) -> int:
        return len(self._signing)

    def names(self) -> list[str]:
        return sorted(self._signing)

    def by_key(self, key: str) -> Client:
        name = self._by_digest.get(_digest(key))
        if name is None:
            raise AuthError("unknown API key")
        return Client(name)

    def mint(
        self,
        client: Client,
        now: float,
        ttl_s: int,
        routes: Iterable[str] = DEFAULT_TOKEN_ROUTES,
        subject: str | None = None,
    ) -> str:
        """A token for `client`'s key, living `ttl_s` (at most `MAX_TOKEN_TTL_S`), calling
        only `routes` (groups of `TOKEN_ROUTES`), held by `subject` (`SUBJECT`; None: the
        key's, counted under it)."""
        routes = sorted(set(routes))
        if subject is not None and not SUBJECT.fullmatch(subject):
            raise ValueError("a subject is 1 to 64 characters of A-Z a-z 0-9 . _ : @ -")
        if unknown := [r for r in routes if r not in TOKEN_ROUTES]:
            raise ValueError(f"unknown route groups {unknown}: choose from {sorted(TOKEN_ROUTES)}")
        if not routes:
            raise ValueError("a token needs at least one route group")
        if not 1 <= ttl_s <= MAX_TOKEN_TTL_S:
            raise ValueError(f"a token lives 1 to {MAX_TOKEN_TTL_S} s")
        claims: dict[str, object] = {"sub": client.name, "exp": int(now) + ttl_s, "routes": routes}
        if subject is not None:
            claims["subject"] = subject
        payload = _b64(orjson.dumps(claims))
        return payload + "." + _b64(self._sign(client.name, payload))

    def by_token(self, token: str, now: float) -> Client:
        payload, sep, signature = token.partition(".")
        try:
            claims = orjson.loads(_unb64(payload)) if sep else None
            given = _unb64(signature)
        except (binascii.Error, ValueError):  # orjson.JSONDecodeError is a ValueError
            claims = None
        if not isinstance(claims, dict):
            raise AuthError("malformed token")
        name, expires = claims.get("sub"), claims.get("exp")
        routes = claims.get("routes", list(DEFAULT_TOKEN_ROUTES))  # minted before routes
        if not isinstance(name, str) or not isinstance(expires, int) or name not in self._signing:
            raise AuthError("invalid token")
        if not hmac.compare_digest(given, self._sign(name, payload)):
            raise AuthError("invalid token")
        if not isinstance(routes, list) or not all(isinstance(r, str) for r in routes):
            raise AuthError("invalid token")
        subject = claims.get("subject")  # minted before subjects: none
        if subject is not None and not (isinstance(subject, str) and SUBJECT.fullmatch(subject)):
            raise AuthError("invalid token")
        if expires <= now:
            raise AuthError("token expired")
        return Client(name, via="token", routes=tuple(routes), subject=subject, expires=expires)

    def _sign(self, name: str, payload: str) -> bytes:
        return hmac.new(self._signing[name], payload.encode("ascii"), hashlib.sha256).digest()


def looks_like_token(credential: str) -> bool:
    return "." in credential and " " not in credential


def bearer(authorization: str | None) -> str | None:
    """The credential of an `Authorization: Bearer ...` header, if that is what it is."""
    if authorization is None:
        return None
    scheme, _, credential = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise AuthError("use 'Authorization: Bearer <key or token>'")
    return credential.strip()
