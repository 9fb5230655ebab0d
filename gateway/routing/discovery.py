"""Which model servers the configured URLs name now: each URL, or one per address when its host
name resolves to several (a Kubernetes headless Service), resolved again at most every
`every_s`. A server found again keeps its object (what was learned of it, the replies placed
there); one whose address is gone is dropped; a new one is made."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urlsplit, urlunsplit

from gateway.aio import Clock


async def expand(url: str) -> list[str]:
    """`url`, or one URL per address when its host name resolves to several."""
    parts = urlsplit(url.rstrip("/"))
    host = parts.hostname or ""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(host)
        return [url.rstrip("/")]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(
            host, parts.port, family=socket.AF_INET, type=socket.SOCK_STREAM
        )
    except OSError:
        return [url.rstrip("/")]  # not resolvable now: kept, and marked down when probed
    addresses = sorted({str(info[4][0]) for info in infos})
    if len(addresses) <= 1:
        return [url.rstrip("/")]
    return [
        urlunsplit(parts._replace(netloc=f"{a}:{parts.port}" if parts.port else a))
        for a in addresses
    ]


def resolve_due(found_any: bool, now: float, resolved_at: float, every_s: float) -> bool:
    """Whether the names are to be resolved again: nothing found yet, or `every_s` has passed
    since they last were."""
    return not found_any or now - resolved_at >= every_s


class Discovery[T]:
    """The servers `urls` name now, each as the object `make` builds for its URL."""

    def __init__(
        self,
        urls: Sequence[str],
        make: Callable[[str], T],
        clock: Clock,
        resolve: Callable[[str], Awaitable[list[str]]] = expand,
    ) -> None:
        """`resolve`: one URL into the URLs of its servers (`expand`, the DNS)."""
        self.urls = urls
        self._make = make
        self._clock = clock
        self._resolve = resolve
        self._found: dict[str, T] = {}
        self._resolved_at = -1e9
        self._lock = asyncio.Lock()  # one resolution at a time; the others wait for it

    @property
    def found(self) -> list[T]:
        """The servers as last resolved, in the order their URLs resolved."""
        return list(self._found.values())

    def __getitem__(self, url: str) -> T:
        return self._found[url]

    async def refresh(self, every_s: float) -> None:
        """Resolve the names again if `every_s` has passed since they last were."""
        async with self._lock:
            now = self._clock()
            if not resolve_due(bool(self._found), now, self._resolved_at, every_s):
                return
            self._resolved_at = now
            urls: list[str] = []
            for url in self.urls:
                urls += await self._resolve(url)
            kept = {u: self._found.get(u) for u in urls}
            self._found = {u: self._make(u) if t is None else t for u, t in kept.items()}
