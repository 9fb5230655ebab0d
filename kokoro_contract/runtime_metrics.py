"""What a process holds, for both services' `/metrics`: resident memory and open file
descriptors (prometheus_client's `ProcessCollector`, Linux `/proc`), live threads and the
asyncio tasks of the serving event loop. `make soak` samples them to find leaks."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class RuntimeCollector(Collector):
    """`process_resident_memory_bytes`, `process_open_fds` (and the rest of the standard
    process families), `python_threads` and `asyncio_tasks`.

    `/metrics` is scraped by a handler running in the service's event loop, so the loop is the
    running one when collected; it is remembered, so a scrape from another thread still counts
    that loop's tasks. `loop` gives it up front."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._process = ProcessCollector(registry=None)
        self._loop = loop

    def collect(self) -> Iterator[Metric]:
        yield from self._process.collect()
        yield GaugeMetricFamily(
            "python_threads", "Live Python threads", value=threading.active_count()
        )
        loop = self._serving_loop()
        if loop is not None:
            yield GaugeMetricFamily(
                "asyncio_tasks",
                "Tasks not yet done in the serving event loop",
                value=len(asyncio.all_tasks(loop)),
            )

    def _serving_loop(self) -> asyncio.AbstractEventLoop | None:
        with contextlib.suppress(RuntimeError):  # not in a loop: the one seen (or given) before
            self._loop = asyncio.get_running_loop()
        if self._loop is None or self._loop.is_closed():
            return None
        return self._loop


def register_runtime(
    registry: CollectorRegistry, loop: asyncio.AbstractEventLoop | None = None
) -> RuntimeCollector:
    """Adds the runtime families to an app's own registry."""
    collector = RuntimeCollector(loop)
    registry.register(collector)
    return collector
