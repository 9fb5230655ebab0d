"""The engines package itself: torch's OpenMP threads sleep while they wait (`OMP_WAIT_POLICY`
PASSIVE, set before torch loads libgomp), unless the environment says otherwise."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = (
    "import os, sys; import model_server.engines; import torch; "
    "print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
)


@pytest.mark.parametrize(("given", "seen"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_torch_threads_sleep_while_waiting_unless_told_otherwise(
    given: str | None, seen: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    done = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [seen, "True"]


def test_the_engines_load_torch_only_after_the_policy_is_set() -> None:
    """Nothing the model server imports before its engines package loads torch: the policy
    is in the environment when libgomp reads it."""
    code = "import sys; import model_server.config, model_server.app; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
