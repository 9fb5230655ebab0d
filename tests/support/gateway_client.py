"""Test-side clients for the gateway: SSE over httpx, and the WebSocket's replies (its audio
framing is `kokoro_voice_client.split_audio_frame`, re-exported here)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import orjson
from kokoro_voice_client import split_audio_frame as split_audio_frame
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.routing.pool import ModelServerPool
from gateway.sources.sse import SSEDecoder, SSEEvent
from tests.support.servers import RunningServer

# how long the test client waits for a server's next bytes: its SSE replies and its /metrics reads
READ_TIMEOUT_S = 15


@dataclass
class SSEReply:
    events: list[SSEEvent] = field(default_factory=list)
    raw: bytes = b""

    @property
    def names(self) -> list[str]:
        return [e.event for e in self.events]

    def data(self, name: str) -> list[dict[str, Any]]:
        return [orjson.loads(e.data) for e in self.events if e.event == name]

    def audio_chunks(self) -> list[bytes]:
        return [base64.b64decode(d["data"]) for d in self.data("audio_chunk")]

    def one(self, name: str) -> dict[str, Any]:
        (only,) = self.data(name)
        return only


async def read_sse(response: httpx.Response) -> SSEReply:
    reply = SSEReply()
    decoder = SSEDecoder()
    raw = bytearray()
    async for chunk in response.aiter_raw():
        raw += chunk
        reply.events += decoder.push(chunk)
    reply.raw = bytes(raw)
    return reply


async def read_reply(response: httpx.Response) -> SSEReply:
    """`read_sse`, asserting the reply ran to its `agent_end`; where it did not, the failure
    shows what came instead (the status and the start of the body)."""
    reply = await read_sse(response)
    assert reply.names[-1:] == ["agent_end"], (response.status_code, reply.raw[:300])
    return reply


async def sse_get(base_url: str, params: dict[str, Any]) -> SSEReply:
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=READ_TIMEOUT_S) as http,
        http.stream("GET", "/v1/speak/sse", params=params) as r,
    ):
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        return await read_sse(r)


async def sse_post(base_url: str, body: dict[str, Any]) -> SSEReply:
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=READ_TIMEOUT_S) as http,
        http.stream("POST", "/v1/speak", json=body) as r,
    ):
        assert r.status_code == 200, await r.aread()
        return await read_sse(r)


def decode_seconds(data: bytes, fmt: str) -> float:
    """Decode a whole stream with FFmpeg; returns its duration."""
    if fmt == "pcm":
        return len(data) / 48_000
    with av.open(io.BytesIO(data), "r") as container:
        return float(sum(f.samples / f.sample_rate for f in container.decode(audio=0)))


async def ws_reply_audio(ws: Any) -> tuple[bytes, dict[str, Any]]:
    """The gateway WebSocket's frames up to `agent_end`, none an error: the utterance's audio
    (its binary frames' codec units) and the `agent_end` event."""
    audio = b""
    while True:
        frame = await ws.recv()
        if isinstance(frame, bytes):
            audio += split_audio_frame(frame)[1]
            continue
        event: dict[str, Any] = orjson.loads(frame)
        assert event["type"] != "error", event
        if event["type"] == "agent_end":
            return audio, event


async def ws_events(ws: Any) -> tuple[bytes, list[dict[str, Any]]]:
    """The gateway WebSocket's frames up to `agent_end`, errors included: the utterance's audio
    (its binary frames' codec units) and its JSON events."""
    audio, events = b"", []
    while True:
        frame = await ws.recv()
        if isinstance(frame, bytes):
            audio += split_audio_frame(frame)[1]
            continue
        events.append(orjson.loads(frame))
        if events[-1]["type"] == "agent_end":
            return audio, events


@contextlib.asynccontextmanager
async def model_server_pool(*urls: str) -> AsyncIterator[ModelServerPool]:
    """A pool of the gateway's over `urls`, on a client of its own, closed after."""
    async with httpx.AsyncClient() as client:
        servers = ModelServerPool(list(urls), client)
        try:
            yield servers
        finally:
            await servers.aclose()


class NoSuchSeries(AssertionError):
    """The metrics have no such series: a gauge never set, a labelled series never touched,
    or a name that is not exported at all."""


async def _families(server: RunningServer) -> list[Metric]:
    """A server's Prometheus metrics: a gateway's on its internal listener, a model server's
    on its own port."""
    base = server.internal_url if server.internal_port is not None else server.http_url
    async with httpx.AsyncClient(base_url=base, timeout=READ_TIMEOUT_S) as http:
        text = (await http.get("/metrics")).text
    return list(text_string_to_metric_families(text))


async def metric(server: RunningServer, name: str, **labels: str) -> float:
    """One sample of a server's metrics; `NoSuchSeries` when there is none (never 0 for a
    series that does not exist: a gauge that was never set reads as missing, not as 0)."""
    for family in await _families(server):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    raise NoSuchSeries(f"no {name}{labels or ''} in the metrics")


async def counted(server: RunningServer, name: str, **labels: str) -> float:
    """A counter's value (or a histogram's `_count` or `_sum`), 0 while its labelled series
    has counted nothing yet (a labelled series appears at its first count); the counter or
    histogram itself must be exported."""
    try:
        return await metric(server, name, **labels)
    except NoSuchSeries:
        suffixes = {"counter": ("", "_total"), "histogram": ("_count", "_sum")}
        for family in await _families(server):
            if any(family.name + end == name for end in suffixes.get(family.type, ())):
                return 0.0
        raise


async def wait_for_metric(server: RunningServer, name: str, value: float, **labels: str) -> float:
    """The series once it reads `value`, or what it reads after 20 s (polled, as an operator's
    dashboard would: a server has no event to wait on from outside)."""
    deadline = time.monotonic() + 20
    now = await metric(server, name, **labels)
    while now != value and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = await metric(server, name, **labels)
    return now
