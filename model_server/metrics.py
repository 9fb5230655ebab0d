"""The model server's Prometheus metrics, read from the scheduler when scraped."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kokoro_contract.runtime_metrics import register_runtime
from model_server.service import ModelService


class SchedulerCollector(Collector):
    def __init__(self, service: ModelService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        if not self.service.ready:
            return
        scheduler = self.service.get().synthesizer.scheduler
        load = scheduler.load()
        yield GaugeMetricFamily(
            "model_server_backlog_seconds",
            "Engine compute queued or running, per worker: the wait a new segment sees",
            value=load.backlog_s,
        )
        yield GaugeMetricFamily(
            "model_server_busy_workers", "Engine workers running a segment", value=load.busy
        )
        yield GaugeMetricFamily("model_server_workers", "Engine workers", value=load.workers)
        yield GaugeMetricFamily(
            "model_server_waiting_segments", "Segments waiting for a worker", value=load.waiting
        )
        yield CounterMetricFamily(
            "model_server_deadline_misses",
            "Engine steps (segments; fronts and windows when progressive) of requests with a "
            "deadline_ms that finished after it",
            value=load.deadline_misses,
        )
        yield CounterMetricFamily(
            "model_server_engine_seconds",
            "Time engine calls took, summed (its rate over the workers: how busy the engine is)",
            value=scheduler.engine_seconds,
        )
        yield CounterMetricFamily(
            "model_server_engine_calls",
            "Engine calls run (ended or aborted)",
            value=scheduler.engine_calls,
        )


def registry_for(service: ModelService) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(service))
    register_runtime(registry)  # memory, descriptors, threads, asyncio tasks
    return registry
