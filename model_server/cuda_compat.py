"""CUDA forward compatibility for the GPU image on hosts with an older NVIDIA driver.

PyPI's torch is built for CUDA 13, which wants driver 580 or newer. SageMaker's GPU hosts run
older drivers (470 by default on ml.g5; 550 with the inference AMI
`al2-ami-sagemaker-inference-gpu-3-1`, whose container toolkit does not mount CUDA's
compatibility libraries). On data-centre GPUs (A10G and up) the forward-compatibility
libraries that the nvidia/cuda base image ships in `/usr/local/cuda/compat` bridge the gap, but
only if the dynamic loader finds them before the host's `libcuda`; the loader reads
LD_LIBRARY_PATH once, at process start. So `serve` checks the host driver first and, when it is
older than the libraries, starts itself again with them on LD_LIBRARY_PATH.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

COMPAT_DIR = Path("/usr/local/cuda/compat")
DRIVER_FILE = Path("/proc/driver/nvidia/version")
MARKER = "KOKORO_CUDA_COMPAT"  # set on the restarted process: never restart twice

_KERNEL_MODULE = re.compile(r"Kernel Module\s+(?:for \S+\s+)?(\d+(?:\.\d+)+)")
_LIBCUDA = re.compile(r"^libcuda\.so\.(\d+(?:\.\d+)+)$")

Version = tuple[int, ...]


def _version(text: str) -> Version:
    return tuple(int(part) for part in text.split("."))


def host_driver_version(proc_text: str) -> Version | None:
    """The kernel module's version from /proc/driver/nvidia/version."""
    match = _KERNEL_MODULE.search(proc_text)
    return _version(match.group(1)) if match else None


def compat_driver_version(file_names: Iterable[str]) -> Version | None:
    """The driver version the compatibility `libcuda.so.X.Y.Z` was cut from."""
    versions = [_version(m.group(1)) for n in file_names if (m := _LIBCUDA.match(n))]
    return max(versions) if versions else None


def compat_environment(
    env: Mapping[str, str], host: Version | None, compat: Version | None, compat_dir: Path
) -> dict[str, str] | None:
    """The environment to restart with, or None when the host's own driver will do."""
    if env.get(MARKER) or host is None or compat is None or host[0] >= compat[0]:
        return None
    paths = [str(compat_dir), *filter(None, env.get("LD_LIBRARY_PATH", "").split(os.pathsep))]
    return {**env, "LD_LIBRARY_PATH": os.pathsep.join(paths), MARKER: "1"}


def restart_if_needed(
    compat_dir: Path = COMPAT_DIR,
    driver_file: Path = DRIVER_FILE,
    execv: Callable[[str, list[str], Mapping[str, str]], object] = os.execve,
) -> None:
    """Restart this process with the compatibility libraries when the host driver needs them."""
    try:
        host = host_driver_version(driver_file.read_text())
        compat = compat_driver_version(p.name for p in compat_dir.iterdir())
    except OSError:  # no NVIDIA driver, or no compatibility libraries in this image
        return
    env = compat_environment(os.environ, host, compat, compat_dir)
    if env is None:
        return
    print(
        f"serve: host NVIDIA driver {'.'.join(map(str, host or ()))} is older than CUDA's "
        f"{'.'.join(map(str, compat or ()))}: restarting with {compat_dir} (forward compatibility)",
        file=sys.stderr,
        flush=True,
    )
    execv(sys.executable, [sys.executable, *sys.orig_argv[1:]], env)
