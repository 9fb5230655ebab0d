"""The engines package itself: torch's OpenMP threads spin only briefly while they wait
(`OMP_WAIT_POLICY` PASSIVE and `GOMP_SPINCOUNT`, set before torch loads libgomp), unless the
environment names either."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from model_server.engines import SPIN_COUNT

CODE = (
    "import os, sys; import model_server.engines; import torch; "
    "print(os.environ.get('OMP_WAIT_POLICY', '-'), os.environ.get('GOMP_SPINCOUNT', '-'), "
    "'torch' in sys.modules)"
)
NAMES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@pytest.mark.parametrize(
    ("given", "seen"),
    [
        ({}, ["PASSIVE", str(SPIN_COUNT)]),
        ({"OMP_WAIT_POLICY": "ACTIVE"}, ["ACTIVE", "-"]),  # ACTIVE's own spin, not ours
        ({"OMP_WAIT_POLICY": "PASSIVE"}, ["PASSIVE", "-"]),  # sleep at once, as asked
        ({"GOMP_SPINCOUNT": "300000"}, ["-", "300000"]),
    ],
)
def test_torch_threads_spin_briefly_unless_told_otherwise(
    given: dict[str, str], seen: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if k not in NAMES} | given
    done = subprocess.run(
        [sys.executable, "-c", CODE], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [*seen, "True"]


def test_the_engines_load_torch_only_after_the_policy_is_set() -> None:
    """Nothing the model server imports before its engines package loads torch: the policy
    is in the environment when libgomp reads it."""
    code = "import sys; import model_server.config, model_server.app; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
