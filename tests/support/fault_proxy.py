"""A loopback TCP proxy in front of one server, that fails as networks and machines do.

- `freeze()`: from now on no byte moves, either way, on any connection, open or new: what a
  frozen (SIGSTOPped) server looks like from outside (the kernel still accepts connections).
- `cut(prefix, after)`: a connection whose request starts with `prefix` is closed once `after`
  bytes of its answer have gone through (0: before the request reaches the server).

It writes down the request line of every request it sees (`requests`: "GET /load", ...), so a
test can tell which server a reply went to. Bound before it serves, like the servers in
`servers.py`: a connection made before the loop runs waits in the backlog.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.proxy_thread import proxy_thread

_REQUEST_LINE = re.compile(
    rb"(GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) ([^ ?]+)\S* HTTP/1\.[01]\r\n"
)


@dataclass(eq=False)  # (kept in a set: by identity)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter
    answer_limit: int | None = None  # bytes of the answer still to let through, when cut

    def close(self) -> None:
        for writer in (self.client, self.upstream):
            with contextlib.suppress(Exception):
                writer.close()


@dataclass
class FaultProxy:
    port: int
    upstream_port: int
    requests: list[str] = field(default_factory=list)
    _cuts: list[tuple[bytes, int]] = field(default_factory=list, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _thawed: asyncio.Event | None = field(default=None, repr=False)
    _stop: asyncio.Event | None = field(default=None, repr=False)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def freeze(self) -> None:
        """Stop every byte, now (it has taken effect when this returns)."""
        self._call(lambda thawed: thawed.clear())

    def thaw(self) -> None:
        self._call(lambda thawed: thawed.set())

    def cut(self, prefix: bytes, after: int) -> None:
        """Close connections whose request starts with `prefix` after `after` answer bytes."""
        self._cuts.append((prefix, after))

    def _call(self, change: Callable[[asyncio.Event], None]) -> None:
        assert self._loop is not None

        async def apply() -> None:
            assert self._thawed is not None
            change(self._thawed)

        asyncio.run_coroutine_threadsafe(apply(), self._loop).result(timeout=10)

    def _request(self, data: bytes, connection: _Connection) -> bool:
        """Note a request that starts this piece; False when it is cut before the server."""
        match = _REQUEST_LINE.match(data)
        if match is None:
            return True
        self.requests.append(f"{match[1].decode()} {match[2].decode()}")
        for prefix, after in self._cuts:
            if data.startswith(prefix):
                connection.answer_limit = after
        return connection.answer_limit != 0

    async def _moving(self) -> None:
        assert self._thawed is not None
        await self._thawed.wait()

    async def _upstream_bound(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        while data := await reader.read(65536):
            forward = self._request(data, connection)  # noted even while frozen
            await self._moving()
            if not forward:
                connection.close()
                return
            connection.upstream.write(data)
            await connection.upstream.drain()

    async def _client_bound(self, reader: asyncio.StreamReader, connection: _Connection) -> None:
        while data := await reader.read(65536):
            await self._moving()
            limit = connection.answer_limit
            if limit is not None:
                data = data[:limit]
                connection.answer_limit = limit - len(data)
            connection.client.write(data)
            await connection.client.drain()
            if connection.answer_limit == 0:
                connection.close()  # a FIN after what got through: the answer ends cut short
                return


async def _serve(sock: socket.socket, proxy: FaultProxy, ready: threading.Event) -> None:
    connections: set[_Connection] = set()
    handlers: set[asyncio.Task[None]] = set()

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", proxy.upstream_port)
        except OSError:
            client_w.close()
            handlers.discard(task)
            return
        up_w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        connection = _Connection(client_w, up_w)
        connections.add(connection)
        try:
            await asyncio.gather(
                proxy._upstream_bound(client_r, connection),
                proxy._client_bound(up_r, connection),
            )
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            connection.close()
            connections.discard(connection)
            handlers.discard(task)

    proxy._loop = asyncio.get_running_loop()
    proxy._thawed = asyncio.Event()
    proxy._thawed.set()
    proxy._stop = asyncio.Event()
    server = await asyncio.start_server(handle, sock=sock)
    ready.set()
    await proxy._stop.wait()
    server.close()
    proxy._thawed.set()
    for connection in list(connections):
        connection.close()  # every pipe then reads its end and returns
    if handlers:
        await asyncio.wait(handlers, timeout=10)
    await server.wait_closed()


def fault_proxy(upstream_port: int) -> contextlib.AbstractContextManager[FaultProxy]:
    """A `FaultProxy` in front of 127.0.0.1:`upstream_port`, in its own thread and loop."""
    return proxy_thread(
        lambda port: FaultProxy(port=port, upstream_port=upstream_port), _serve, "fault-proxy"
    )
