"""`make dev` on any machine: the engine chosen from what is detected (pure), the model
server's flags reaching it, a missing checkpoint stopping it with the model server's message,
and the ready banner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from model_server.cli import resolve_engine
from model_server.config import Settings
from model_server.detect import cuda_device, detect
from model_server.engine_choice import HUB_REPO, Choice, Detected, choose_engine
from model_server.service import preferred_voice
from scripts import dev
from tests.support.servers import RunningServer, free_port

ROOT = Path(__file__).resolve().parents[2]

GPU = "cuda:0 (NVIDIA A10G)"
CKPT = Path("/models/Kokoro-82M")


@pytest.mark.parametrize(
    ("explicit", "detected", "choice"),
    [
        # nothing but a CPU: the registry's int8 ONNX model
        ("auto", Detected(None, None, False, False), Choice("onnx", reason="no CUDA device")),
        # a checkpoint without a GPU is still the CPU engine's job
        ("auto", Detected(None, CKPT, False, False), Choice("onnx", reason="no CUDA device")),
        ("auto", Detected(GPU, CKPT, False, False), Choice("torch", model_dir=CKPT, reason=GPU)),
        (
            "auto",
            Detected(GPU, None, True, False),
            Choice("torch", model_repo=HUB_REPO, reason=f"{GPU}, {HUB_REPO} cached"),
        ),
        (
            "auto",
            Detected(GPU, None, False, True),
            Choice("torch", model_repo=HUB_REPO, reason=f"{GPU}, {HUB_REPO} from the hub"),
        ),
        (
            "auto",
            Detected(GPU, None, False, False),
            Choice("onnx", reason=f"{GPU} but no Kokoro checkpoint (KOKORO_MODEL_DIR)"),
        ),
        # an explicit choice always wins
        ("onnx", Detected(GPU, CKPT, True, True), Choice("onnx", reason="--engine onnx")),
        ("torch", Detected(None, None, False, False), Choice("torch", reason="--engine torch")),
        (
            "torch",
            Detected(None, CKPT, False, False),
            Choice("torch", model_dir=CKPT, reason="--engine torch"),
        ),
    ],
)
def test_the_engine_follows_what_is_detected(
    explicit: str, detected: Detected, choice: Choice
) -> None:
    assert choose_engine(explicit, detected) == choice


def test_an_unknown_engine_is_refused() -> None:
    with pytest.raises(ValueError, match="use auto, onnx or torch"):
        choose_engine("tensorrt", Detected(None, None, False, False))


def test_the_default_voice_is_english_when_one_is_loaded() -> None:
    registry = frozenset({"jf_alpha", "jf_gongitsune", "jm_kumo"})
    assert preferred_voice(registry) == "jm_kumo"  # the most intelligible (bench-quality)
    assert preferred_voice(registry | {"bf_emma", "am_adam"}) == "am_adam"
    assert preferred_voice(registry | {"bf_emma", "af_heart"}) == "af_heart"


def test_on_this_machine_auto_is_the_onnx_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if cuda_device() is not None:
        pytest.skip("a CUDA device is present")
    assert detect(tmp_path).cuda is None
    resolved = resolve_engine(Settings(engine="auto", model_dir=tmp_path))
    assert resolved.engine == "onnx"
    assert capsys.readouterr().out == "model-server: engine onnx (no CUDA device)\n"


def test_model_args_reach_the_model_server_after_auto() -> None:
    command = dev.model_server_command(
        "127.0.0.1", 8080, "--engine torch --model-dir '/models/Kokoro 82M' --workers 4"
    )
    assert command[1:] == [
        "--host",
        "127.0.0.1",
        "--port",
        "8080",
        "--engine",
        "auto",
        "--engine",  # later flags win: the explicit choice
        "torch",
        "--model-dir",
        "/models/Kokoro 82M",
        "--workers",
        "4",
    ]
    assert dev.model_server_command("127.0.0.1", 8080, "")[-2:] == ["--engine", "auto"]


def test_the_ready_banner_names_engine_and_voice(fake_server: RunningServer) -> None:
    ping = httpx.get(fake_server.http_url + "/ping").json()
    assert (ping["engine"], ping["voice"]) == ("fake on cpu", "af_test")
    banner = dev.banner("http://127.0.0.1:8000", fake_server.http_url, ping)
    assert "ready: http://127.0.0.1:8000" in banner
    assert "engine fake on cpu, voice af_test" in banner


def run_dev(model_args: str) -> subprocess.CompletedProcess[str]:
    """`make dev` with MODEL_ARGS, on free ports."""
    command = [sys.executable, str(ROOT / "scripts" / "dev.py"), "--model-args", model_args]
    command += ["--model-port", str(free_port()), "--port", str(free_port())]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.slow
def test_a_missing_checkpoint_stops_make_dev_with_the_model_servers_message(
    tmp_path: Path,
) -> None:
    result = run_dev(f"--engine torch --model-dir {tmp_path / 'absent'}")
    assert result.returncode == 2
    message, dev_line = result.stderr.splitlines()  # nothing else: the gateway, still
    assert f"model directory {tmp_path / 'absent'} does not exist" in message  # starting,
    assert dev_line.startswith("dev: a service exited during start-up")  # stops silently


@pytest.mark.slow
def test_a_bad_model_server_flag_stops_make_dev(tmp_path: Path) -> None:
    result = run_dev("--workers many")
    assert result.returncode == 2
    assert "argument --workers: invalid int value: 'many'" in result.stderr


def test_the_gpu_check_script_parses() -> None:
    result = subprocess.run(["bash", "-n", str(ROOT / "scripts" / "gpu-check")], check=False)
    assert result.returncode == 0
    text = (ROOT / "scripts" / "gpu-check").read_text()
    steps = (
        "KOKORO_TEST_DEVICE=$device",
        "bench.bench_model --engine torch",
        "bench.bench_load",
        "bench.bench_batch",  # --batch off and on, side by side
    )
    for step in (
        *steps,
        "device=${TORCH_DEVICE:-cuda}",  # CUDA unless told otherwise
        "--sections progressive",  # the torch engine's progressive table
        "${STEPS:-load batch model progressive tests}",
        'tests.support.kokoro_checkpoint "$dir" --full',
    ):
        assert step in text
