"""What the gateway and the model server both assume, checked on each side's own values: the
`/load` answer the server gives is what the gateway's admission reads, every field; both count a
first chunk and a segment in the contract's phonemes, expect the same decoder windows, and start
from the contract's speed priors. Each test fails when one side goes its own way."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.reply.plan.rates import chunk_speed
from gateway.reply.plan.timeline import window_spans
from gateway.routing import admission, pool
from kokoro_contract.audio import SAMPLE_RATE
from kokoro_contract.load import (
    FIRST_CHUNK_PHONEMES,
    FRAME_S,
    LARGEST_WINDOW_FRAMES,
    SEGMENT_PHONEMES,
    LoadReport,
)
from kokoro_contract.speed import (
    PRIOR_SECONDS_PER_CALL,
    PRIOR_SECONDS_PER_CHARACTER,
    PRIOR_SECONDS_PER_PHONEME,
    SpeedModel,
)
from model_server.engines.base import SAMPLES_PER_FRAME
from model_server.scheduler import Scheduler
from model_server.windows import Schedule
from tests.support.fakes import FakeEngine, serve_fake


def said_by(scheduler: Scheduler) -> LoadReport:
    try:
        return scheduler.load()
    finally:
        scheduler.close()


def test_the_servers_load_report_is_what_admission_reads() -> None:
    """Every field the scheduler says, through the wire, is what admission reads."""
    scheduler = Scheduler(2, "fair")
    scheduler.progressive = True
    said = said_by(scheduler)
    read = admission.LoadReport.decode(said.encode())
    assert isinstance(read, admission.LoadReport)
    assert dataclasses.asdict(read) == dataclasses.asdict(said)
    assert (read.scheduling, read.first_window_s) == ("fair", said.first_window_s)
    assert read.first_window_s is not None
    assert read.first_chunk_s == read.first_window_s


async def test_the_servers_load_route_is_what_the_gateways_pool_reads() -> None:
    """The model server's real route over the fake engine, read by the gateway's pool: the
    body is the contract's encoding of the scheduler's report, and the pool's load is it."""
    with serve_fake(FakeEngine()) as server:
        scheduler = server.app.state.service.get().synthesizer.scheduler
        scheduler.progressive = True  # a first window priced too: every field has a value
        expected = scheduler.load()  # idle: the route says the same (probes are not inflight)
        async with httpx.AsyncClient() as client:
            body = (await client.get(server.http_url + "/load")).content
            servers = pool.ModelServerPool([server.http_url], client)
            try:
                chosen = await servers.pick(3.0)
            finally:
                await servers.aclose()
    assert body == expected.encode()
    assert isinstance(chosen, pool.Upstream)
    assert chosen.load is not None
    assert dataclasses.asdict(chosen.load) == dataclasses.asdict(expected)


def test_both_price_a_first_chunk_at_the_contracts_phonemes() -> None:
    """The server publishes its first window for a first chunk of `FIRST_CHUNK_PHONEMES`;
    a gateway prices the first chunk of a server that is not progressive at as many."""
    scheduler = Scheduler(2)
    scheduler.first_window = SpeedModel(0.2, 0.01)
    scheduler.progressive = True
    said = said_by(scheduler)
    assert said.first_window_s == round(0.2 + 0.01 * FIRST_CHUNK_PHONEMES, 3)
    whole = admission.LoadReport(2, 0, 0, 0.0, None, 0.1, 0.02)
    assert whole.first_chunk_s == pytest.approx(0.1 + 0.02 * FIRST_CHUNK_PHONEMES)


def test_both_reckon_a_typical_segment_at_the_contracts_phonemes() -> None:
    """The server's real-time capacity and admission's slowdown of a reply joined by another
    both take a segment of `SEGMENT_PHONEMES` (alone: 0.1 s + 20 ms a phoneme; beside
    another: 0.2 s + 30 ms)."""
    scheduler = Scheduler(2)
    scheduler.shared_speed = SpeedModel(0.2, 0.03)
    scheduler.audio_per_phoneme = 0.065
    said = said_by(scheduler)
    shared_s = 0.2 + 0.03 * SEGMENT_PHONEMES
    assert said.realtime_streams == round(2 / (shared_s / (SEGMENT_PHONEMES * 0.065)), 2)
    load = admission.LoadReport(2, 0, 0, 0.0, None, 0.1, 0.02, 1e9, 0.2, 0.03)
    assert load.slowdown(1) == pytest.approx(shared_s / (0.1 + 0.02 * SEGMENT_PHONEMES))


def test_both_expect_the_same_decoder_windows() -> None:
    """The server's window ladder (its first window doubled up to the largest) is the one the
    gateway's chunk plan expects, in seconds of the same frames."""
    schedule = Schedule()
    assert schedule.largest == LARGEST_WINDOW_FRAMES
    assert SAMPLES_PER_FRAME / SAMPLE_RATE == FRAME_S
    largest_s = PlanConfig().largest_window_s
    assert largest_s == pytest.approx(LARGEST_WINDOW_FRAMES * FRAME_S)
    ladder = [size * FRAME_S for size in schedule.sizes]
    spans = window_spans(60.0, ladder[0], largest_s)  # a minute: the ladder, then its top
    sizes = [end - begin for begin, end in spans]
    assert sizes[: len(ladder)] == pytest.approx(ladder)
    assert sizes[len(ladder) : -1] == pytest.approx([largest_s] * (len(sizes) - len(ladder) - 1))


def test_both_start_from_the_contracts_speed_priors() -> None:
    """Before any call: the server's engine line per phoneme, a gateway's chunk line per
    character, both with the same seconds per call."""
    scheduler = Scheduler(1)
    try:
        assert scheduler.speed.line == (PRIOR_SECONDS_PER_CALL, PRIOR_SECONDS_PER_PHONEME)
    finally:
        scheduler.close()
    assert chunk_speed().line == (PRIOR_SECONDS_PER_CALL, PRIOR_SECONDS_PER_CHARACTER)
    assert ChunkPlan().speed.line == chunk_speed().line
