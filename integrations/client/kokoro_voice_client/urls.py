"""The gateway's addresses from its base URL, one rule for every client."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

SPEAK_WS_PATH = "/v1/speak/ws"
SPEECH_PATH = "/v1/audio/speech"


@dataclass(frozen=True)
class Endpoints:
    speak_ws: str
    """The speak WebSocket, `ws(s)://.../v1/speak/ws`."""
    speech: str
    """The OpenAI-style route, `http(s)://.../v1/audio/speech`."""


def endpoints(url: str) -> Endpoints:
    """The gateway's two routes from its URL: `http(s)://` or `ws(s)://`, host and port, an
    optional path prefix (a gateway behind a proxy), and optionally already ending in `/v1`
    (as OpenAI-style clients are often given it) or in the speak WebSocket's own path."""
    parts = urlsplit(url.strip().rstrip("/"))
    if parts.scheme not in ("http", "https", "ws", "wss") or not parts.netloc:
        raise ValueError(f"the gateway URL must be http(s):// or ws(s)://host[:port], not {url!r}")
    path = parts.path.removesuffix(SPEAK_WS_PATH).removesuffix("/v1").rstrip("/")
    secure = parts.scheme in ("https", "wss")
    http = urlunsplit(("https" if secure else "http", parts.netloc, path, "", ""))
    ws = urlunsplit(("wss" if secure else "ws", parts.netloc, path, "", ""))
    return Endpoints(speak_ws=ws + SPEAK_WS_PATH, speech=http + SPEECH_PATH)


def speak_ws_url(url: str, protocol: int = 1) -> str:
    """The speak WebSocket's address for a gateway URL (see `endpoints`); with `protocol` 2,
    asking for protocol 2 (`?protocol=2`: several contexts on one socket)."""
    address = endpoints(url).speak_ws
    return address if protocol == 1 else f"{address}?protocol={protocol}"
