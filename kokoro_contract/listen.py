"""The services' listening sockets, bound before anything serves: an address in use (a second
gateway on the same host) is one line naming the address and the flag to change, and exit
status 2, never a server's traceback."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """Whether listening on `host` reaches only this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class CannotListen(Exception):
    """The message says which address, why, and which flag chooses another."""


def bind(host: str, port: int, flag: str) -> socket.socket:
    """A TCP socket bound to (`host`, `port`), as uvicorn binds its own (SO_REUSEADDR, so a
    restart does not wait out TIME_WAIT); the server listens on it. `flag` names the
    setting of the port (`--internal-port`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        raise CannotListen(
            f"cannot listen on {host}:{port} ({why}): choose another with {flag}"
        ) from None
    sock.set_inheritable(True)
    return sock
