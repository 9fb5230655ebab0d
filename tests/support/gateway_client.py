"""Test-side clients for the gateway: SSE over httpx, and the WebSocket framing."""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from gateway.sources.sse import SSEDecoder, SSEEvent
from tests.support.servers import RunningServer


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


async def sse_get(base_url: str, params: dict[str, Any]) -> SSEReply:
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=15) as http,
        http.stream("GET", "/v1/speak/sse", params=params) as r,
    ):
        assert r.status_code == 200, await r.aread()
        assert r.headers["content-type"].startswith("text/event-stream")
        return await read_sse(r)


async def sse_post(base_url: str, body: dict[str, Any]) -> SSEReply:
    async with (
        httpx.AsyncClient(base_url=base_url, timeout=15) as http,
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


def split_audio_frame(frame: bytes) -> tuple[str, bytes]:
    """The gateway's WebSocket audio framing: [n][utterance id][codec units]."""
    n = frame[0]
    return frame[1 : 1 + n].decode("ascii"), frame[1 + n :]


async def metric(server: RunningServer, name: str, **labels: str) -> float:
    """One sample of the gateway's Prometheus metrics (0 when it has not been observed)."""
    async with httpx.AsyncClient(base_url=server.internal_url) as http:
        text = (await http.get("/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0
