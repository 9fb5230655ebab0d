"""`kokoro_contract.runtime_metrics`: memory, descriptors, threads and asyncio tasks, as both
services' `/metrics` report them (what `make soak` samples)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.metrics import GatewayMetrics
from kokoro_contract.runtime_metrics import RuntimeCollector, register_runtime

FAMILIES = ("process_resident_memory_bytes", "process_open_fds", "python_threads", "asyncio_tasks")
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def scraped(registry: CollectorRegistry) -> dict[str, float]:
    """Each family's value, parsed back from the exposition text (as a scraper sees it)."""
    text = generate_latest(registry).decode()
    return {
        family.name: family.samples[0].value
        for family in text_string_to_metric_families(text)
        if family.samples
    }


@linux_only
async def test_the_four_families_have_plausible_values() -> None:
    registry = CollectorRegistry()
    register_runtime(registry)
    values = scraped(registry)  # in a running loop, as a /metrics handler runs
    assert set(FAMILIES) <= set(values)
    assert values["process_resident_memory_bytes"] > 1 << 20  # an interpreter is over 1 MiB
    assert values["process_open_fds"] > 0
    assert values["python_threads"] >= 1
    assert values["asyncio_tasks"] >= 1  # this test's own task


def test_tasks_are_those_of_the_running_loop() -> None:
    collector = RuntimeCollector()

    def tasks() -> float:
        (family,) = [m for m in collector.collect() if m.name == "asyncio_tasks"]
        return family.samples[0].value

    async def main() -> None:  # a loop of its own: no other test's tasks in it
        assert tasks() == 1  # the current task
        release = asyncio.Event()
        extra = [asyncio.create_task(release.wait()) for _ in range(3)]
        assert tasks() == 4
        release.set()
        await asyncio.gather(*extra)
        assert tasks() == 1

    asyncio.run(main())


def test_outside_a_loop_it_counts_the_loop_seen_last() -> None:
    collector = RuntimeCollector()
    names = [m.name for m in collector.collect()]
    assert "python_threads" in names
    assert "asyncio_tasks" not in names  # no loop seen yet: the family is left out

    async def scrape() -> None:
        list(collector.collect())

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(scrape())
        (family,) = [m for m in collector.collect() if m.name == "asyncio_tasks"]
        assert family.samples[0].value == 0  # that loop, now idle
    finally:
        loop.close()
    assert "asyncio_tasks" not in [m.name for m in collector.collect()]  # closed: left out


@linux_only
async def test_both_services_register_it() -> None:
    from model_server.config import Settings
    from model_server.metrics import registry_for
    from model_server.service import ModelService

    gateway_values = scraped(GatewayMetrics().registry)
    model_values = scraped(registry_for(ModelService(Settings())))
    for values in (gateway_values, model_values):
        assert set(FAMILIES) <= set(values)
