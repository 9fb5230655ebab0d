"""A port in use (a second gateway on the same host): one line naming it and its flag, exit 2,
for every listener of both services."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from kokoro_contract.listen import CannotListen, bind
from tests.support.servers import free_port


@pytest.fixture
def taken() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_bind_names_the_address_and_the_flag(taken: int) -> None:
    with pytest.raises(CannotListen) as refused:
        bind("127.0.0.1", taken, "--internal-port")
    assert str(refused.value) == (
        f"cannot listen on 127.0.0.1:{taken} (Address already in use): "
        "choose another with --internal-port"
    )
    sock = bind("127.0.0.1", 0, "--port")  # a free one is bound, not yet listening
    try:
        assert sock.getsockname()[0] == "127.0.0.1"
    finally:
        sock.close()


GATEWAY = [sys.executable, "-c", "from gateway.cli import main; main()"]
MODEL_SERVER = [sys.executable, "-c", "from model_server.cli import main; main()"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "flags", "flag", "name"),
    [
        (GATEWAY, ["--port", "{taken}", "--internal-port", "{free}"], "--port", "gateway"),
        (GATEWAY, ["--port", "{free}", "--internal-port", "{taken}"], "--internal-port", "gateway"),
        (MODEL_SERVER, ["--port", "{taken}"], "--port", "model-server"),
    ],
    ids=["gateway public", "gateway internal", "model server"],
)
def test_a_port_in_use_is_one_line_and_exit_2(
    taken: int, command: list[str], flags: list[str], flag: str, name: str
) -> None:
    args = [f.format(taken=taken, free=free_port()) for f in flags]
    done = subprocess.run([*command, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"{name}: cannot listen on 127.0.0.1:{taken} (Address already in use): "
        f"choose another with {flag}"
    ]
