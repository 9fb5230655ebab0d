"""Servers the tests share. Real uvicorn servers on loopback ports (tests/support/servers.py):

- `model_server` / `gateway_server`: the real model server (Kokoro-82M int8 on onnxruntime,
  espeak G2P) and a gateway in front of it; one each for the whole session. Tests that use
  them are marked `real_model`.
- `fake_server` / `gateway_on_fake`: the same apps over `FakeEngine`, a fast, controllable
  engine for protocol edge cases; one each for the whole session. `fake_engine` hands a test
  the engine, reset. `own_fake_server` is a private one, for tests that count connections.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from model_server.config import Settings
from tests.support.fakes import FAKE_SETTINGS, FakeEngine, serve_fake
from tests.support.servers import RunningServer, serve, serve_real_model

__all__ = ["FAKE_SETTINGS"]  # where the suite has always imported it from

# The suite runs offline, its model servers on the registry's voices (jm_kumo the default):
# none asks the hub for English voices, nor finds them in a developer's Hugging Face cache.
# Model servers started as processes read this; tests/model_server/engines/test_hub_voices.py
# gives its own a stand-in hub.
os.environ["MODEL_SERVER_ENGLISH_VOICES"] = "off"


@pytest.fixture(scope="session")
def model_server() -> Iterator[RunningServer]:
    """The real model server: real Kokoro-82M int8 weights on onnxruntime, real espeak G2P."""
    with serve_real_model(Settings(workers=2, english_voices="off")) as running:
        yield running


@pytest.fixture(scope="session")
def gateway_server(model_server: RunningServer) -> Iterator[RunningServer]:
    """The real gateway in front of the real model server."""
    from gateway.app import create_app as create_gateway
    from gateway.config import Settings as GatewaySettings

    app = create_gateway(GatewaySettings(model_server_url=model_server.http_url))
    with serve(app) as running:
        yield running


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

    app = create_gateway(GatewaySettings(model_server_url=fake_server.http_url))
    with serve(app) as running:
        yield running


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Static credentials for the real AWS SDK clients talking to local emulators."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that reaches the real model is marked `real_model`, so `-m "not real_model"`
    is a dependable quick run."""
    unmarked = [
        item.nodeid
        for item in items
        if "model_server" in getattr(item, "fixturenames", ())
        and item.get_closest_marker("real_model") is None
    ]
    if unmarked:
        raise pytest.UsageError(f"mark these real_model: {', '.join(unmarked)}")
