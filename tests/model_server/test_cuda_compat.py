"""CUDA forward compatibility at `serve` start-up: when to restart with the compat libraries."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest

from model_server import cuda_compat
from model_server.cuda_compat import (
    MARKER,
    compat_driver_version,
    compat_environment,
    host_driver_version,
    restart_if_needed,
)

PROC_550 = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.127.05  Tue Oct  8 03:22:07 UTC 2024\n"
    "GCC version:  gcc version 10.5.0 20230707 (Red Hat 10.5.0-1) (GCC)\n"
)
PROC_OPEN_580 = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:55:41 UTC 2025\n"
)
COMPAT_FILES = [
    "libcuda.so",
    "libcuda.so.1",
    "libcuda.so.580.82.07",
    "libnvidia-ptxjitcompiler.so.580.82.07",
]


def test_versions_are_read_from_the_kernel_module_and_the_library_names() -> None:
    assert host_driver_version(PROC_550) == (550, 127, 5)
    assert host_driver_version(PROC_OPEN_580) == (580, 95, 5)
    assert host_driver_version("no driver here") is None
    assert compat_driver_version(COMPAT_FILES) == (580, 82, 7)
    assert compat_driver_version(["libcuda.so.1", "README"]) is None


def test_an_older_driver_gets_the_compat_libraries_first() -> None:
    env = compat_environment(
        {"LD_LIBRARY_PATH": "/usr/local/nvidia/lib64", "PATH": "/bin"},
        (550, 127, 5),
        (580, 82, 7),
        Path("/usr/local/cuda/compat"),
    )
    assert env is not None
    assert env["LD_LIBRARY_PATH"] == os.pathsep.join(
        ["/usr/local/cuda/compat", "/usr/local/nvidia/lib64"]
    )
    assert env[MARKER] == "1"
    assert env["PATH"] == "/bin"


@pytest.mark.parametrize(
    ("env", "host", "compat"),
    [
        ({}, (580, 95, 5), (580, 82, 7)),  # same branch: the host's own driver
        ({}, (590, 1), (580, 82, 7)),  # newer host: never downgrade
        ({}, None, (580, 82, 7)),  # no driver: CPU
        ({}, (550, 1), None),  # no compat libraries in this image
        ({MARKER: "1"}, (550, 1), (580, 82, 7)),  # already restarted once
    ],
)
def test_no_restart_when_it_would_not_help(
    env: dict[str, str], host: tuple[int, ...] | None, compat: tuple[int, ...] | None
) -> None:
    assert compat_environment(env, host, compat, Path("/c")) is None


def test_restart_execs_this_command_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    driver = tmp_path / "version"
    driver.write_text(PROC_550)
    compat = tmp_path / "compat"
    compat.mkdir()
    for name in COMPAT_FILES:
        (compat / name).touch()
    monkeypatch.delenv(MARKER, raising=False)
    monkeypatch.setattr(sys, "orig_argv", ["/opt/venv/bin/python3", "/opt/venv/bin/serve", "serve"])
    calls: list[tuple[str, list[str], Mapping[str, str]]] = []
    restart_if_needed(compat, driver, lambda *args: calls.append(args))
    ((path, argv, env),) = calls
    assert path == sys.executable
    assert argv == [sys.executable, "/opt/venv/bin/serve", "serve"]
    assert env["LD_LIBRARY_PATH"].split(os.pathsep)[0] == str(compat)


def test_no_driver_no_restart(tmp_path: Path) -> None:
    calls: list[object] = []
    restart_if_needed(tmp_path / "compat", tmp_path / "absent", lambda *a: calls.append(a))
    assert calls == []
    assert Path("/proc/driver/nvidia/version") == cuda_compat.DRIVER_FILE
