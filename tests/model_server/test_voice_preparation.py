"""Work done ahead: each voice's norm priors made in the background once the server is ready
(`ModelService._prepare`, `StreamPriors.prepare`), a whole call at a time while no synthesis
runs, so a voice's first request does not wait for them; a request that does wait for one
ends the pause, and the server's stop ends the work."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from model_server import service as service_module
from model_server.app import create_app
from model_server.engines.base import CancelToken
from model_server.engines.streamed import LENGTH_CALIBRATION, StreamedDecoder, StreamPriors
from model_server.scheduler import Scheduler
from tests.support.fakes import FAKE_SETTINGS, FakeProgressiveEngine, identity_g2p
from tests.support.servers import serve

VOICE = "af_test"
PHRASES = sum(len(p) for p in LENGTH_CALIBRATION.values())


@dataclasses.dataclass(frozen=True)
class _Inputs:
    frames: int


class _Decoder:
    """What `StreamPriors` asks of a streamed decoder: whole calls (counted), each giving one
    generator norm's statistics, and the decoder's own conversions to and from `NormStats`."""

    generator_norms = ("generator.norm",)
    device = torch.device("cpu")
    prior = StreamedDecoder.prior
    prior_statistics = StreamedDecoder.prior_statistics

    def __init__(self) -> None:
        self.calls = 0

    def whole(self, inputs: _Inputs) -> tuple[Any, dict[str, Any]]:
        self.calls += 1
        level = torch.full((1, 2, 1), float(inputs.frames))
        return np.zeros(1, np.float32), {"generator.norm": (level, level / 10)}


def _priors(directory: Path) -> tuple[StreamPriors, _Decoder]:
    decoder = _Decoder()
    priors = StreamPriors(
        decoder,  # type: ignore[arg-type]
        directory,
        "test-model",
        lambda phonemes, voice: _Inputs(len(phonemes)),  # type: ignore[arg-type,return-value]
        lambda voice: np.arange(4, dtype=np.float32),
    )
    return priors, decoder


def test_prepare_pauses_before_each_whole_call_and_keeps_the_prior(tmp_path: Path) -> None:
    priors, decoder = _priors(tmp_path)
    pauses: list[int] = []
    assert priors.prepare(VOICE, lambda wanted: pauses.append(decoder.calls))
    assert pauses == list(range(PHRASES))  # one before each call, none after the last
    assert decoder.calls == PHRASES
    assert len(list(tmp_path.glob(f"{VOICE}.*.npz"))) == len(LENGTH_CALIBRATION)
    prepared = priors(VOICE)  # a stream's ask: known, no call more
    assert decoder.calls == PHRASES
    # kept: another process reads it back, with no call and no pause
    again, fresh = _priors(tmp_path)
    again.prepare(VOICE, lambda wanted: pytest.fail("paused with nothing to compute"))
    assert fresh.calls == 0
    for (frames, stats), (other_frames, other) in zip(
        prepared.points, again(VOICE).points, strict=True
    ):
        assert frames == other_frames
        torch.testing.assert_close(stats["generator.norm"][0], other["generator.norm"][0])


def test_a_pause_that_raises_stops_it_and_the_voice_is_made_when_asked(tmp_path: Path) -> None:
    priors, decoder = _priors(tmp_path)

    def stop_at_third(wanted: Callable[[], bool]) -> None:
        if decoder.calls == 2:
            raise KeyboardInterrupt  # anything the caller raises ends it there

    with pytest.raises(KeyboardInterrupt):
        priors.prepare(VOICE, stop_at_third)
    assert decoder.calls == 2
    assert not list(tmp_path.glob("*.npz"))  # nothing half made is kept
    priors(VOICE)  # asked: made whole, from the start
    assert decoder.calls == 2 + PHRASES


def test_a_stream_waiting_for_a_prior_ends_the_pause(tmp_path: Path) -> None:
    """The preparation pauses (live work runs); a stream then asks for the voice it is making:
    the pause is told, the calibration goes on at once, and the stream gets the prior made once."""
    priors, decoder = _priors(tmp_path)
    paused = threading.Event()
    told: list[bool] = []

    def pause(wanted: Callable[[], bool]) -> None:
        if decoder.calls == 1:  # the server is busy: wait, until a stream wants it
            paused.set()
            deadline = time.monotonic() + 30
            while not wanted():
                assert time.monotonic() < deadline, "never told"
                time.sleep(0.001)  # a poll of the flag the stream raises, as the server's
            told.append(True)

    preparing = threading.Thread(target=priors.prepare, args=(VOICE, pause))
    preparing.start()
    assert paused.wait(30)
    got = priors(VOICE)  # waits behind the calibration, which its ask lets go on
    preparing.join(30)
    assert not preparing.is_alive()
    assert told == [True]
    assert decoder.calls == PHRASES  # made once, for both
    assert priors(VOICE) is got


def test_it_gives_way_to_a_stream_waiting_for_another_voice(tmp_path: Path) -> None:
    """A stream asks for another voice while the preparation pauses: the preparation stops
    (nothing kept, False: ask again later), so the stream does not wait behind it."""
    priors, decoder = _priors(tmp_path)
    paused = threading.Event()

    def pause(wanted: Callable[[], bool]) -> None:
        if decoder.calls == 1:
            paused.set()
            deadline = time.monotonic() + 30
            while not wanted():
                assert time.monotonic() < deadline, "never told"
                time.sleep(0.001)

    result: list[bool] = []
    preparing = threading.Thread(target=lambda: result.append(priors.prepare(VOICE, pause)))
    preparing.start()
    assert paused.wait(30)
    priors("jf_other")  # made at once, not behind VOICE's calibration
    preparing.join(30)
    assert result == [False]
    assert decoder.calls == 1 + PHRASES  # VOICE's one call, then the other's whole calibration
    assert [p.name.split(".")[0] for p in tmp_path.glob("*.npz")] == ["jf_other"] * 3
    assert priors.prepare(VOICE, lambda wanted: None)  # asked again: made
    assert decoder.calls == 1 + 2 * PHRASES


def test_quiet_is_how_long_no_engine_call_has_run_or_waited() -> None:
    now = [100.0]
    scheduler = Scheduler(1)
    scheduler.clock = lambda: now[0]
    scheduler._idle_since = now[0]  # as if made at this clock's 100 s
    seen: list[float] = []

    def call(cancel: CancelToken) -> None:
        seen.append(scheduler.quiet_s())  # while it runs
        now[0] += 0.5

    async def run() -> None:
        now[0] += 2.0
        assert scheduler.quiet_s() == 2.0
        await scheduler.run("k", call)

    try:
        asyncio.run(run())
    finally:
        scheduler.close()
    assert seen == [0.0]
    assert scheduler.quiet_s() == 0.0  # it has just ended
    now[0] += 1.5
    assert scheduler.quiet_s() == 1.5


class _PreparingEngine(FakeProgressiveEngine):
    """Prepares a voice in two steps, each after a pause; `fails` fails its voice."""

    def __init__(
        self, fails: str = "", block: threading.Event | None = None, gives_way: str = ""
    ) -> None:
        super().__init__()
        self.fails = fails
        self.gives_way = gives_way  # this voice gives way once (a request waited for another)
        self.asked: list[str] = []
        self.block = block
        self.prepared: list[str] = []
        self.started = threading.Event()

    def prepare_voice(self, voice: str, pause: Any) -> bool:
        self.started.set()
        self.asked.append(voice)
        if voice == self.gives_way and self.asked.count(voice) == 1:
            pause(lambda: False)
            return False
        for _ in range(2):
            pause(lambda: False)
            if self.block is not None:
                self.block.wait(30)
        if voice == self.fails:
            raise RuntimeError("no pack")
        self.prepared.append(voice)
        return True


def _server(engine: _PreparingEngine) -> Any:
    settings = dataclasses.replace(FAKE_SETTINGS, prepare_voices=True)
    return create_app(settings, engine_factory=lambda _: engine, g2p_factory=identity_g2p)


def test_every_voice_is_prepared_once_ready_the_default_first(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(service_module, "QUIET_S", 0.0)
    engine = _PreparingEngine(fails="jf_alpha")
    app = _server(engine)
    with caplog.at_level(logging.INFO, "model_server.service"), serve(app):
        assert app.state.service.prepared.wait(30)
    assert engine.prepared == [VOICE]  # the default (the fake's English voice), then the rest
    assert "could not prepare the voice jf_alpha ahead: no pack" in caplog.text
    assert "voices prepared: 1 of 2" in caplog.text


def test_a_voice_that_gave_way_is_prepared_after_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service_module, "QUIET_S", 0.0)
    engine = _PreparingEngine(gives_way=VOICE)
    app = _server(engine)
    with serve(app):
        assert app.state.service.prepared.wait(30)
    assert engine.asked == [VOICE, "jf_alpha", VOICE]
    assert engine.prepared == ["jf_alpha", VOICE]


def test_the_servers_stop_ends_the_preparation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "QUIET_S", 0.0)
    block = threading.Event()
    engine = _PreparingEngine(block=block)
    app = _server(engine)
    with serve(app):
        assert engine.started.wait(30)  # its first step under way, held
        service = app.state.service
        assert not service.prepared.is_set()
        # the step under way ends once the server is stopping (as a whole call would)

        def release() -> None:
            assert service._stop.wait(30)
            block.set()

        releasing = threading.Thread(target=release)
        releasing.start()
    releasing.join(30)
    assert service.prepared.is_set()  # the server's `close` waited for the step
    assert engine.prepared == []  # stopped at its next pause: no voice more


def test_off_prepares_nothing() -> None:
    engine = _PreparingEngine()
    settings = dataclasses.replace(FAKE_SETTINGS, prepare_voices=False)
    app = create_app(settings, engine_factory=lambda _: engine, g2p_factory=identity_g2p)
    with serve(app):
        assert app.state.service.prepared.wait(30)
    assert not engine.started.is_set()
