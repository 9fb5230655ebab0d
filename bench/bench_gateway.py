"""`make bench`: time to first audio through the gateway, bidi vs batch, from one run.

Starts the real model server and the real gateway on loopback ports in this process. The answer
is five sentences from the echo source paced like an LLM (40 tokens/s, first token at 300 ms).
For each mode, p50 over `--runs` replies (modes alternate, so both see the same machine state)
of the time from sending the request to receiving the first audio event. Also printed:

- the floor physics allows for bidi: when the paced text completes the first chunk, plus the
  model server's own time to first audio for that chunk sent to it directly;
- the gateway's added latency: first audio through the gateway minus first audio from the
  model server directly, for the same (unpaced) text;
- the answer given at once (unpaced, bidi): its first audio (median and range: the plan's hold
  shows here, which the cut of its first chunk moves); its last audio and the model server's
  engine seconds for it (`model_server_engine_seconds_total`), each against one raw
  onnxruntime call of the whole answer (the registry's graph, the same threads and voice),
  alternating; and the chunks the gateway cut it into, as raw calls one after another, against
  the same one call (what the cutting alone costs, whatever the engine) and against the engine
  seconds (what the engine costs beyond raw calls of the same chunks);
- a second turn while the first turn's context is still open (spoken up to a flush, waiting for
  more text): the second's first audio as a second context on the same socket (protocol 2)
  against a second socket (protocol 1), alternating; 2 x `--runs` of each;
- a barge-in (the answer given at once, interrupted at its first audio) to the next turn's first
  audio: protocol 1 (cancel, its `cancelled`, then the next `speak`) against protocol 2 (cancel
  and the next context's `speak` at once), alternating; 2 x `--runs` of each.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
from websockets.asyncio.client import connect

from gateway.reply.plan.config import PlanConfig
from gateway.reply.plan.playback_plan import ChunkPlan
from gateway.sources.echo import tokens
from gateway.sources.sse import SSEDecoder

ANSWER = (
    "Sure, I can help you with that right away. Your order shipped yesterday from our "
    "warehouse in Portland. It should arrive by Thursday afternoon. You will get a tracking "
    "link by email within the hour. Is there anything else I can do for you today?"
)
TPS = 40.0
FIRST_MS = 300.0
SECOND = "Yes, of course, one moment."


async def gateway_ttfa(base: str, params: dict[str, object]) -> float:
    return (await gateway_audio(base, params))[0]


async def gateway_audio(base: str, params: dict[str, object]) -> tuple[float, float, Any]:
    """(first audio, last audio, `agent_end`'s metrics) of one reply over SSE, seconds from
    sending the request."""
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        started = time.perf_counter()
        async with http.stream("POST", "/v1/speak", json=params) as r:
            decoder = SSEDecoder()
            first = last = metrics = None
            async for chunk in r.aiter_raw():
                for event in decoder.push(chunk):
                    if event.event == "audio_chunk":
                        last = time.perf_counter() - started
                        first = last if first is None else first
                    if event.event == "agent_end":
                        metrics = orjson.loads(event.data)["metrics"]
                    if event.event == "error":
                        raise RuntimeError(event.data)
        assert first is not None
        assert last is not None
        return first, last, metrics


def cut_as(text: str, chars: list[int]) -> list[str]:
    """`text` cut into chunks of `chars` characters, a space between one and the next (the
    gateway's `chunk_chars`)."""
    pieces, at = [], 0
    for n in chars:
        pieces.append(text[at : at + n])
        at += n + 1
    if " ".join(pieces) != text:
        raise RuntimeError(f"chunks of {chars} characters are not the text")
    return pieces


def engine_seconds(model_base: str) -> float:
    """The model server's `model_server_engine_seconds_total`: engine time spent so far."""
    for line in httpx.get(f"{model_base}/metrics", timeout=10).text.splitlines():
        if line.startswith("model_server_engine_seconds_total "):
            return float(line.split()[1])
    raise RuntimeError("the model server reports no model_server_engine_seconds_total")


async def at_once(
    gateway: str, model_base: str, raw: Callable[[str], float], voice: str, runs: int, fmt: str
) -> list[tuple[str, str]]:
    """The answer given at once through the gateway (bidi) against one raw call of it."""
    whole: list[float] = []
    first: list[float] = []
    last: list[float] = []
    engine: list[float] = []
    cut: list[float] = []  # raw calls of the chunks as the gateway cut them
    cuts: list[str] = []
    await asyncio.to_thread(raw, ANSWER)  # a session's first run is slower: not counted
    for _ in range(runs):
        whole.append(await asyncio.to_thread(raw, ANSWER))
        before = engine_seconds(model_base)
        params: dict[str, object] = {"text": ANSWER, "format": fmt, "voice": voice, "mode": "bidi"}
        start, end, metrics = await gateway_audio(gateway, params)
        first.append(start)
        last.append(end)
        engine.append(engine_seconds(model_base) - before)
        chunks = cut_as(ANSWER, metrics["chunk_chars"])
        cuts.append(" | ".join(str(len(c)) for c in chunks))
        cut.append(sum([await asyncio.to_thread(raw, chunk) for chunk in chunks]))

    def ratio(values: list[float], against: list[float] = whole) -> str:
        ratios = [v / w for v, w in zip(values, against, strict=True)]
        spread = f"[{min(ratios):.2f}-{max(ratios):.2f}]"
        median = statistics.median(values) * 1000
        return f"{median:.0f} ms, {statistics.median(ratios):.2f}x {spread}"

    return [
        ("given at once: one raw onnxruntime call", f"{statistics.median(whole) * 1000:.0f} ms"),
        (
            "given at once, bidi: first audio",
            f"{statistics.median(first) * 1000:.0f} ms "
            f"[{min(first) * 1000:.0f}-{max(first) * 1000:.0f}]",
        ),
        ("given at once, bidi: last audio (/ raw)", ratio(last)),
        ("given at once, bidi: engine time (/ raw)", ratio(engine)),
        ("given at once, bidi: its chunks' characters", ", ".join(sorted(set(cuts)))),
        ("given at once: raw calls of its chunks (/ raw)", ratio(cut)),
        ("given at once, bidi: engine time (/ raw calls of its chunks)", ratio(engine, cut)),
    ]


async def model_server_ttfa(ws_base: str, text: str) -> float:
    async with connect(ws_base + "/invocations-bidirectional-stream") as ws:
        started = time.perf_counter()
        await ws.send(orjson.dumps({"text": text}))
        async for frame in ws:
            if isinstance(frame, bytes):
                first = time.perf_counter() - started
                async for rest in ws:
                    if isinstance(rest, str) and "synthesis_complete" in rest:
                        break
                return first
    raise RuntimeError("no audio")


def first_chunk_release(config: PlanConfig) -> tuple[str, float]:
    """The first chunk and when paced text lets the gateway's chunk plan release it (s)."""
    plan = ChunkPlan(config)
    for i, token in enumerate(tokens(ANSWER)):
        at = FIRST_MS / 1000 + i / TPS
        released = plan.push(token, at)
        if released:
            return released[0].text, at
    raise RuntimeError("no chunk")


async def run(
    gateway: str,
    model_ws: str,
    runs: int,
    fmt: str,
    config: PlanConfig,
    whole: tuple[str, Callable[[str], float], str] | None = None,
) -> None:
    """`whole`: the model server's base URL, a raw call and the voice, for the answer given at
    once against one raw call of it."""
    paced = {"text": ANSWER, "format": fmt, "echo_tps": TPS, "echo_first_ms": FIRST_MS}
    await gateway_ttfa(gateway, {"text": "Warm up.", "format": fmt})
    ttfa: dict[str, list[float]] = {"bidi": [], "batch": []}
    for _ in range(runs):
        for mode in ("bidi", "batch"):
            ttfa[mode].append(await gateway_ttfa(gateway, {**paced, "mode": mode}))
    chunk, release_s = first_chunk_release(config)
    # direct and through the gateway alternate, so each pair sees the same machine state
    direct: list[float] = []
    added_each: list[float] = []
    for _ in range(2 * runs):
        direct.append(await model_server_ttfa(model_ws, chunk))
        through = await gateway_ttfa(gateway, {"text": chunk, "format": fmt})
        added_each.append(through - direct[-1])

    bidi, batch = statistics.median(ttfa["bidi"]), statistics.median(ttfa["batch"])
    floor = release_s + statistics.median(direct)
    added = statistics.median(added_each)
    text_s = FIRST_MS / 1000 + (len(tokens(ANSWER)) - 1) / TPS
    print(
        f"\ngateway bench: 5-sentence answer ({len(ANSWER)} chars, {len(tokens(ANSWER))} tokens "
        f"at {TPS:.0f} tokens/s, first at {FIRST_MS:.0f} ms; text complete at {text_s:.2f} s), "
        f"format {fmt}, first chunk at a boundary (<= {config.first_wait_words} words), "
        f"p50 of {runs} runs"
    )
    rows = [
        ("batch: time to first audio", f"{batch * 1000:.0f} ms"),
        ("bidi: time to first audio", f"{bidi * 1000:.0f} ms"),
        ("bidi / batch", f"1/{batch / bidi:.1f} ({bidi / batch:.2f})"),
        (f"floor: first chunk released ({chunk!r})", f"{release_s * 1000:.0f} ms"),
        ("floor: + model server TTFA for it, direct", f"{floor * 1000:.0f} ms"),
        ("bidi above the floor", f"{(bidi - floor) * 1000:.0f} ms"),
        ("gateway added latency (same text, unpaced; p50 of pairs)", f"{added * 1000:.0f} ms"),
    ]
    if whole is not None:
        rows += await at_once(gateway, *whole, runs, fmt)
        rows += await second_turns(gateway.replace("http", "ws", 1), runs, fmt)
        rows += await barge_ins(gateway.replace("http", "ws", 1), runs, fmt)
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"  {name.ljust(width)}  {value}")


class Socket:
    """A speak WebSocket read in the background: when each utterance's (or context's) frames of
    each kind came (`audio` for its binary frames)."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.seen: dict[tuple[str, str], float] = {}
        self._arrived: dict[tuple[str, str], asyncio.Event] = {}
        self._reading = asyncio.create_task(self._read())

    async def _read(self) -> None:
        from kokoro_voice_client import split_audio_frame

        async for frame in self.ws:
            if isinstance(frame, bytes):
                self._note("audio", split_audio_frame(frame)[0])
                continue
            event = orjson.loads(frame)
            if event["type"] == "error":
                raise RuntimeError(event)
            self._note(event["type"], event.get("context_id") or event.get("utterance_id"))

    def _note(self, kind: str, uid: str) -> None:
        self.seen.setdefault((kind, uid), time.perf_counter())
        self._arrived.setdefault((kind, uid), asyncio.Event()).set()

    async def send(self, **body: Any) -> float:
        """Send a message; the moment it went."""
        await self.ws.send(orjson.dumps(body).decode())
        return time.perf_counter()

    async def until(self, kind: str, uid: str) -> float:
        """When the first frame of `kind` for `uid` came; the reader's failure (an error
        frame) is raised here."""
        arrived = self._arrived.setdefault((kind, uid), asyncio.Event())
        waiting = asyncio.ensure_future(arrived.wait())
        await asyncio.wait([waiting, self._reading], return_when=asyncio.FIRST_COMPLETED)
        if not waiting.done():
            waiting.cancel()
            self._reading.result()
            raise RuntimeError("the socket closed")
        return self.seen[(kind, uid)]

    async def aclose(self) -> None:
        self._reading.cancel()
        await asyncio.gather(self._reading, return_exceptions=True)


async def second_turn(ws_base: str, fmt: str, same_socket: bool, n: int) -> float:
    """The second turn's first audio, seconds from its `speak`, while the first turn's context
    is open on the socket (spoken up to a flush, waiting for more text)."""
    a, b = f"a{n}", f"b{n}"
    async with connect(ws_base + "/v1/speak/ws?protocol=2", max_size=None) as ws:
        first = Socket(ws)
        await first.send(type="speak", context_id=a, format=fmt)
        await first.send(type="text", context_id=a, delta="Hello there. ")
        await first.send(type="flush", context_id=a, flush_id=1)
        await first.until("flushed", a)
        if same_socket:
            sent = await first.send(type="speak", context_id=b, format=fmt, text=SECOND)
            took = await first.until("audio", b) - sent
            await first.until("agent_end", b)
        else:
            async with connect(ws_base + "/v1/speak/ws", max_size=None) as ws2:
                other = Socket(ws2)
                sent = await other.send(type="speak", utterance_id=b, format=fmt, text=SECOND)
                took = await other.until("audio", b) - sent
                await other.until("agent_end", b)
                await other.aclose()
        await first.send(type="close_context", context_id=a)
        await first.until("agent_end", a)
        await first.aclose()
        return took


async def barge_in(ws_base: str, fmt: str, protocol: int, n: int) -> float:
    """From the cancel of a playing answer to the next turn's first audio."""
    a, b = f"a{n}", f"b{n}"
    key = "context_id" if protocol == 2 else "utterance_id"
    async with connect(ws_base + f"/v1/speak/ws?protocol={protocol}", max_size=None) as ws:
        s = Socket(ws)
        await s.send(type="speak", format=fmt, text=ANSWER, **{key: a})
        await s.until("audio", a)
        if protocol == 2:
            sent = await s.send(type="cancel", context_id=a)
            await s.send(type="speak", context_id=b, format=fmt, text=SECOND)
        else:
            sent = await s.send(type="cancel")
            await s.until("cancelled", a)
            await s.send(type="speak", utterance_id=b, format=fmt, text=SECOND)
        took = await s.until("audio", b) - sent
        await s.until("agent_end", b)
        await s.aclose()
        return took


async def alternating(
    runs: int, measure: Callable[[int, int], Awaitable[float]]
) -> tuple[list[float], list[float]]:
    """`measure(side, n)` for sides 0 and 1, one after the other, `2 * runs` rounds: each
    side's times."""
    times: tuple[list[float], list[float]] = ([], [])
    for n in range(2 * runs):
        for side in (0, 1):
            times[side].append(await measure(side, n))
    return times


def timed_row(label: str, times: list[float]) -> tuple[str, str]:
    """A row: the median and the range, in ms."""
    spread = f"{min(times) * 1000:.0f}-{max(times) * 1000:.0f}"
    return label, f"{statistics.median(times) * 1000:.0f} ms ({spread})"


def ratio(times: list[float], against: list[float]) -> str:
    return f"{statistics.median(times) / statistics.median(against):.2f}"


async def barge_ins(ws_base: str, runs: int, fmt: str) -> list[tuple[str, str]]:
    one, two = await alternating(
        runs, lambda side, n: barge_in(ws_base, fmt, side + 1, 2 * n + side + 1)
    )
    return [
        timed_row("barge-in to the next turn's first audio: protocol 1", one),
        timed_row("barge-in to the next turn's first audio: protocol 2", two),
        ("protocol 2 / protocol 1", ratio(two, one)),
    ]


async def second_turns(ws_base: str, runs: int, fmt: str) -> list[tuple[str, str]]:
    # side 0: the same socket (second_turn's `same` True, its seed 2n + 1), 1: a second one
    same, other = await alternating(
        runs, lambda side, n: second_turn(ws_base, fmt, side == 0, 2 * n + (side == 0))
    )
    return [
        timed_row("second turn's first audio: a context on the same socket (protocol 2)", same),
        timed_row("second turn's first audio: a second socket (protocol 1)", other),
        ("same socket / second socket", ratio(same, other)),
    ]


@contextmanager
def sagemaker_gateway(model: Any, base: Any) -> Iterator[Any]:
    """A gateway whose TTS goes through the SageMaker emulators in front of `model`."""
    import dataclasses
    import os

    from emulators.sagemaker_bidi import SeamTransport
    from emulators.sagemaker_stream import create_sagemaker_stream_emulator
    from gateway.app import create_app as create_gateway
    from tests.support.servers import serve

    seam = SeamTransport(model.ws_url + "/invocations-bidirectional-stream")
    with serve(create_sagemaker_stream_emulator(model.http_url)) as stream:
        os.environ.update(
            AWS_ACCESS_KEY_ID="AKIDEXAMPLE",
            AWS_SECRET_ACCESS_KEY="emulated",
            AWS_EC2_METADATA_DISABLED="true",
            AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME=stream.http_url,
        )
        settings = dataclasses.replace(
            base,
            tts_transport="sagemaker",
            sagemaker_endpoint="kokoro-tts",
            aws_region="us-east-1",
        )
        with serve(create_gateway(settings, sagemaker_http2_transport=seam)) as gw:
            yield gw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--format", default="mp3")
    parser.add_argument("--first-max-words", type=int, default=None)
    parser.add_argument("--skip-sagemaker", action="store_true", help="only the local path")
    parser.add_argument(
        "--first-hold-s", type=float, default=None, help="the gateway's (0: never held)"
    )
    parser.add_argument(
        "--progressive", choices=["on", "off"], default="on", help="the model server's"
    )
    parser.add_argument(
        "--decoder-threads", type=int, default=0, help="the model server's (0: its default)"
    )
    args = parser.parse_args()

    from gateway.app import create_app as create_gateway
    from gateway.config import Settings as GatewaySettings
    from model_server.app import create_app
    from model_server.config import Settings
    from tests.support.servers import serve

    model_settings = Settings(
        progressive=args.progressive == "on", decoder_threads=args.decoder_threads
    )
    model_app = create_app(model_settings)
    with serve(model_app) as model:
        if not model_app.state.service.settled.wait(300) or not model_app.state.service.ready:
            raise SystemExit(f"model server failed: {model_app.state.service.failure}")
        overrides = {}
        if args.first_max_words is not None:
            overrides["first_max_words"] = args.first_max_words
        if args.first_hold_s is not None:
            overrides["first_hold_s"] = args.first_hold_s
        # one client asks for every reply here: no per-client quota
        settings = GatewaySettings(
            model_server_url=model.http_url, replies_per_minute=0, **overrides
        )
        chunker = PlanConfig(
            settings.first_min_words, settings.first_max_words, settings.first_wait_words
        )
        from bench.bench_model import raw_onnx_call

        voice = model_app.state.service.get().rules.default_voice
        whole = (model.http_url, raw_onnx_call(model_settings.engine_threads, voice), voice)
        with serve(create_gateway(settings)) as gw:
            asyncio.run(run(gw.http_url, model.ws_url, args.runs, args.format, chunker, whole))
        if not args.skip_sagemaker:
            with sagemaker_gateway(model, settings) as gw:
                print("\nthe same through the SageMaker path (emulated on loopback: HTTP/2 SDK")
                print("through its transport seam for bidi, aioboto3 response stream for batch)")
                asyncio.run(run(gw.http_url, model.ws_url, args.runs, args.format, chunker))


if __name__ == "__main__":
    main()
