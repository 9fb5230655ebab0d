"""A loopback TCP proxy that cuts every CR it forwards from the server into a write of its own.

Each piece the upstream sends is written to the client in parts ending at each `\\r`, with a
drain (the bytes handed to the kernel; TCP_NODELAY sends them at once) and a short pause
between them, so the `\\r` and the `\\n` of each CRLF leave in separate segments and
a reader sees reads that end between them (sse-starlette ends its lines with CRLF). Client bytes
go upstream unchanged. It is bound before it serves, like the servers in `servers.py`: a
connection made before the loop runs waits in the backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from dataclasses import dataclass, field

from tests.support.proxy_thread import proxy_thread

_AFTER_CR = re.compile(rb"(?<=\r)")


def split_after_cr(data: bytes) -> list[bytes]:
    """`data` cut after every CR: b"a\\r\\nb" -> [b"a\\r", b"\\nb"]."""
    return [piece for piece in _AFTER_CR.split(data) if piece]


@dataclass
class SplitProxy:
    port: int
    upstream_port: int
    pause_s: float = 0.01  # between a CR and what follows it
    split_writes: int = 0  # writes that ended in a CR, for the test to see the proxy did its job
    _stop: asyncio.Event | None = field(default=None, repr=False)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, proxy: SplitProxy | None
) -> None:
    try:
        while data := await reader.read(65536):
            if proxy is None:
                writer.write(data)
                await writer.drain()
                continue
            for piece in split_after_cr(data):
                writer.write(piece)
                await writer.drain()
                if piece.endswith(b"\r"):
                    proxy.split_writes += 1
                    # a pause on the wire, as a slow network would make: long enough that the
                    # browser reads the CR before the LF is sent (the test checks that it did)
                    await asyncio.sleep(proxy.pause_s)
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def _serve(sock: socket.socket, proxy: SplitProxy, ready: threading.Event) -> None:
    writers: set[asyncio.StreamWriter] = set()
    handlers: set[asyncio.Task[None]] = set()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        writers.add(client_w)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", proxy.upstream_port)
        except OSError:
            client_w.close()
            return
        writers.add(up_w)
        up_w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await asyncio.gather(_pipe(client_r, up_w, None), _pipe(up_r, client_w, proxy))
        finally:
            writers.discard(client_w)
            writers.discard(up_w)
            handlers.discard(task)

    proxy._stop = asyncio.Event()
    server = await asyncio.start_server(handle, sock=sock)
    ready.set()
    await proxy._stop.wait()
    server.close()
    for writer in list(writers):  # idle keep-alive connections the browser still holds
        writer.close()
    await asyncio.gather(*handlers, return_exceptions=True)
    await server.wait_closed()


def split_proxy(upstream_port: int) -> contextlib.AbstractContextManager[SplitProxy]:
    """A `SplitProxy` in front of 127.0.0.1:`upstream_port`, in its own thread and loop."""
    return proxy_thread(
        lambda port: SplitProxy(port=port, upstream_port=upstream_port), _serve, "split-proxy"
    )
