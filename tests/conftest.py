from __future__ import annotations

from collections.abc import Iterator

import pytest

from model_server.app import create_app
from model_server.config import Settings
from tests.fakes import FakeEngine, identity_g2p
from tests.servers import RunningServer, serve


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
