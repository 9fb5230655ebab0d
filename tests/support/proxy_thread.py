"""A TCP proxy of the tests' own, served in a thread with its own loop (the proxies in
`split_proxy` and `fault_proxy`): a listening socket on a free loopback port, the proxy's
`_serve` coroutine on it, stopped by setting the proxy's `_stop` event."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, Protocol


class Proxy(Protocol):
    port: int
    _stop: asyncio.Event | None


@contextlib.contextmanager
def proxy_thread[P: Proxy](
    make: Callable[[int], P],
    serve: Callable[[socket.socket, P, threading.Event], Coroutine[Any, Any, None]],
    name: str,
) -> Iterator[P]:
    """`make(port)`'s proxy, served by `serve(sock, proxy, ready)` until the way out."""
    # IPPROTO_TCP named so that asyncio sets TCP_NODELAY on accepted connections
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    proxy = make(sock.getsockname()[1])
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(serve(sock, proxy, ready)),
        name=f"{name}-{proxy.port}",
    )
    thread.start()
    try:
        assert ready.wait(timeout=10)
        yield proxy
    finally:
        ready.wait(timeout=10)
        stop = proxy._stop
        if stop is not None:
            loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=30)
        loop.close()
        sock.close()
