"""Servers, engines and judges the tests share. Real uvicorn servers on loopback ports
(tests/support/servers.py):

- `model_server` / `gateway_server`: the real model server (Kokoro-82M int8 on onnxruntime,
  espeak G2P) and a gateway in front of it; one each for the whole session. Tests that use
  them are marked `real_model`.
- `one_call_model_server`: a second real model server that voices each segment in one engine
  call (`--progressive off`), for the quality guards' reference audio.
- `stream_engine` / `windows_engine`: the real onnx engine in the test's own process, one per
  progressive decoder (`--decoder stream`, `--decoder windows`), for tests that call its passes.
- `mos_judge` / `asr_judge`: the offline judges of quality/judges.py (DistillMOS, PocketSphinx).
- `fake_server` / `gateway_on_fake`: the same apps over `FakeEngine`, a fast, controllable
  engine for protocol edge cases; one each for the whole session. `fake_engine` hands a test
  the engine, reset. `own_fake_server` is a private one, for tests that count connections.

The session-scoped ones are made when a test first asks for them, once per run: the real
weights are loaded once per configuration, DistillMOS once. A test that uses a real engine
(`REAL_MODEL_FIXTURES`) must be marked `real_model`.
"""

from __future__ import annotations

import os

# The suite's torch threads sleep at once instead of spinning briefly (the engines package's
# default, model_server/engines/__init__.py), set before anything loads torch, for this process
# and the servers it starts: two test workers share the cores, each with torch teams, and a
# team spinning beside the other stretched a batch reply past the test client's read timeout.
# What is under test is unchanged: the audio is the same at any speed; how fast is the
# benchmarks' to measure (docs/measured.md), and tests/model_server/engines/test_package.py
# checks the default in a fresh interpreter.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from model_server.config import Settings
from tests.support.fakes import FAKE_SETTINGS, FakeEngine, serve_fake
from tests.support.servers import RunningServer, serve, serve_real_model

if TYPE_CHECKING:
    from model_server.engines.onnx import OnnxEngine
    from quality.judges import AsrJudge, MosJudge

__all__ = ["FAKE_SETTINGS"]  # where the suite has always imported it from

# The suite runs offline, its model servers on the registry's voices (jm_kumo the default):
# none asks the hub for English voices, nor finds them in a developer's Hugging Face cache.
# Model servers started as processes read this; tests/model_server/engines/test_hub_voices.py
# gives its own a stand-in hub.
os.environ["MODEL_SERVER_ENGLISH_VOICES"] = "off"


@pytest.fixture(scope="session")
def model_server() -> Iterator[RunningServer]:
    """The real model server: real Kokoro-82M int8 weights on onnxruntime, real espeak G2P."""
    # its voices' priors made when first asked, not in the background between the tests (a
    # core taken from the test beside; tests/model_server/test_voice_preparation.py covers it)
    settings = Settings(workers=2, english_voices="off", prepare_voices=False)
    with serve_real_model(settings) as running:
        yield running


@pytest.fixture(scope="session")
def gateway_server(model_server: RunningServer) -> Iterator[RunningServer]:
    """The real gateway in front of the real model server."""
    from gateway.app import create_app as create_gateway
    from gateway.config import Settings as GatewaySettings

    app = create_gateway(GatewaySettings(model_server_url=model_server.http_url))
    with serve(app) as running:
        yield running


@pytest.fixture(scope="session")
def one_call_model_server() -> Iterator[RunningServer]:
    """A real model server that voices each segment in one engine call (`--progressive off`),
    one worker: the same audio from run to run, whatever the machine's speed."""
    settings = Settings(workers=1, english_voices="off", progressive=False)
    with serve_real_model(settings) as running:
        yield running


def _onnx_engine(decoder: str) -> OnnxEngine:
    from model_server.engines.onnx import OnnxEngine, OnnxOptions

    return OnnxEngine(OnnxOptions(intra_op_threads=2, decoder=decoder))


@pytest.fixture(scope="session")
def stream_engine() -> OnnxEngine:
    """The real onnx engine in this process, progressive with the streamed decoder
    (`--decoder stream`: the registry's decoder weights in torch), on 2 threads."""
    return _onnx_engine("stream")


@pytest.fixture(scope="session")
def windows_engine() -> OnnxEngine:
    """The real onnx engine in this process, progressive with the windows decoder
    (`--decoder windows`: the split graphs over windows with context), on 2 threads."""
    return _onnx_engine("windows")


@pytest.fixture(scope="session")
def mos_judge() -> MosJudge:
    """DistillMOS (quality/judges.py): deterministic, so one serves every test."""
    from quality.judges import MosJudge

    return MosJudge()


@pytest.fixture(scope="session")
def asr_judge() -> AsrJudge:
    """PocketSphinx (quality/judges.py): a fresh decoder for every clip, so one serves every
    test."""
    from quality.judges import AsrJudge

    return AsrJudge()


def _serve_fake(engine: FakeEngine) -> Iterator[RunningServer]:
    with serve_fake(engine) as running:
        yield running


@pytest.fixture(scope="session")
def shared_fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture(autouse=True)
def _fresh_fake_engine(shared_fake_engine: FakeEngine) -> None:
    shared_fake_engine.reset()


@pytest.fixture
def fake_engine(shared_fake_engine: FakeEngine) -> FakeEngine:
    return shared_fake_engine


@pytest.fixture(scope="session")
def fake_server(shared_fake_engine: FakeEngine) -> Iterator[RunningServer]:
    """The real app and routes over a fast, controllable engine, for protocol edge cases."""
    yield from _serve_fake(shared_fake_engine)


@pytest.fixture
def own_fake_server(fake_engine: FakeEngine) -> Iterator[RunningServer]:
    """A fake model server of the test's own: nothing else connects to it."""
    yield from _serve_fake(fake_engine)


@pytest.fixture(scope="session")
def gateway_on_fake(fake_server: RunningServer) -> Iterator[RunningServer]:
    """The real gateway in front of the model server with the controllable engine."""
    from gateway.app import create_app as create_gateway
    from gateway.config import Settings as GatewaySettings

    # every test of a worker is one client to it (loopback): its replies per minute would
    # pass the default quota of 60 as the suite grows, and whether its server has spare time
    # for a reply depends on how busy the machine running the suite is; the quotas and
    # admission are tested on gateways of their own
    settings = GatewaySettings(
        model_server_url=fake_server.http_url, replies_per_minute=0, admission=False
    )
    app = create_gateway(settings)
    with serve(app) as running:
        yield running


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Static credentials for the real AWS SDK clients talking to local emulators."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


# the fixtures above that load the real Kokoro-82M weights (gateway_server through model_server)
REAL_MODEL_FIXTURES = frozenset(
    {"model_server", "one_call_model_server", "stream_engine", "windows_engine"}
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that reaches the real model is marked `real_model`, so `-m "not real_model"`
    is a dependable quick run."""
    unmarked = [
        item.nodeid
        for item in items
        if REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ()))
        and item.get_closest_marker("real_model") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"mark these real_model: {', '.join(unmarked)}")
