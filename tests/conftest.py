from __future__ import annotations

from collections.abc import Iterator

import pytest

from model_server.app import create_app
from model_server.config import Settings
from tests.support.fakes import FakeEngine, identity_g2p
from tests.support.servers import RunningServer, serve


@pytest.fixture(scope="session")
def model_server() -> Iterator[RunningServer]:
    """The real model server: real Kokoro-82M int8 weights on onnxruntime, real espeak G2P."""
    app = create_app(Settings(workers=2))
    with serve(app) as running:
        assert app.state.service.settled.wait(timeout=120), "model did not load"
        assert app.state.service.ready, app.state.service.failure
        yield running


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def fake_server(fake_engine: FakeEngine) -> Iterator[RunningServer]:
    """The real app and routes over a fast, controllable engine, for protocol edge cases."""
    settings = Settings(workers=2, max_text_chars=200, max_pending=4, warmup=False)
    app = create_app(settings, engine_factory=lambda _: fake_engine, g2p_factory=identity_g2p)
    with serve(app) as running:
        assert app.state.service.settled.wait(timeout=10)
        yield running


@pytest.fixture(scope="session")
def gateway_server(model_server: RunningServer) -> Iterator[RunningServer]:
    """The real gateway in front of the real model server."""
    from gateway.app import create_app as create_gateway
    from gateway.config import Settings as GatewaySettings

    app = create_gateway(GatewaySettings(model_server_url=model_server.http_url))
    with serve(app) as running:
        yield running


@pytest.fixture
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
