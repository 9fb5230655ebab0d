"""`make soak`: the real stack under simulated conversations for a long time, watched for leaks.

Starts the real model server (onnx engine, real Kokoro-82M int8) and the real gateway as
separate processes on free ports (`bench.harness.stack`, as `make bench-load` does; the
gateway's internal listener on a free port for /metrics, their logs kept in files), warms up
with one reply, then runs N conversations through the gateway for `--duration` (N: `auto`
reads the model server's `/load` realtime_streams, the replies this machine voices at once).

Each conversation does one thing at a time, then thinks 1-3 s (seeded): mostly normal replies
(the demo's 5-sentence answer from the echo source paced like an LLM, PCM, over SSE or over a
WebSocket that may ask twice before it closes; the listener hears the whole reply), barge-ins
(`{"type":"cancel"}` at the first audio, then maybe another reply on the same socket), client
disconnects at the first audio (the SSE stream closed; the WebSocket's TCP connection aborted),
reconnects (a WebSocket dropped mid-reply that connects again at once and asks again, then an
EventSource reconnect after the end, answered 204) and bad requests (invalid JSON, an unknown
field, text too long, a non-JSON content type -> 415, invalid JSON on the WebSocket, a
WebSocket message past `--max-message-bytes` -> close 1009). A refusal because of load (503
`overloaded`, 429) is an expected outcome: it is asked again after its Retry-After.

Every `--interval` s it samples both services' /metrics: RSS, open descriptors, asyncio tasks,
threads, the gateway's errors by code and the model server's deadline misses. At the end: the
table, the outcomes, the verdict (`bench/soak_report.py` has the rules), a PNG plot; exits 1
when the verdict fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import random
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from bench.harness import (
    BYTES_PER_SECOND,
    Listener,
    ReplyResult,
    Stack,
    error_code,
    one_reply,
    paced_answer,
    stack,
)
from bench.soak_report import (
    REFUSAL_CODES,
    Rules,
    Sample,
    is_refusal,
    log_problems,
    new_error_codes,
    outcome_table,
    parse_duration,
    read_metrics,
    table,
    unexpected,
    verdict,
    verdict_lines,
    windows,
)
from tests.support.servers import free_port

ACTION_TIMEOUT_S = 180.0  # one action (a reply is ~20 s): longer is a hang, an unexpected error
# codes the soak provokes on purpose, besides refusals
PROVOKED_CODES = frozenset(
    {
        "invalid_json",
        "invalid_field",
        "text_too_long",
        "unsupported_media_type",
        "nothing_to_cancel",
    }
)


class Unexpected(Exception):
    """Something the run saw that counts against the goal."""


@dataclass
class Tally:
    outcomes: Counter[str] = field(default_factory=Counter)
    unexpected: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    def served(self) -> int:
        """Replies heard to the end, besides the warm-up."""
        return sum(
            n for k, n in self.outcomes.items() if k.endswith(": served") and "warm-up" not in k
        )

    def fail(self, reason: str) -> None:
        self.outcomes[f"UNEXPECTED {reason}"] += 1
        self.unexpected[reason] += 1


@dataclass
class Run:
    stack: Stack
    tally: Tally
    max_message_bytes: int
    ws_url: str = ""
    ids: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.ws_url = self.stack.gateway.replace("http://", "ws://", 1) + "/v1/speak/ws"

    def utterance_id(self, who: str) -> str:
        self.ids[who] += 1
        return f"{who}-{self.ids[who]}"


# --- replies -------------------------------------------------------------------------------------


def judge(tally: Tally, kind: str, result: ReplyResult) -> float:
    """Counts a reply's outcome; returns how long a refused ask waits (its Retry-After), else 0."""
    if result.refused or is_refusal(result.status, result.code):
        status = f"{result.status} " if result.status else ""  # none: a WebSocket error frame
        tally.add(f"{kind}: refused {status}{result.code}")
        return result.retry_after_s
    why = unexpected(result.status or None, result.code, text=result.error or "")
    if why is None and result.error is not None:
        why = f"error {result.code or result.error[:80]}"
    if why is not None:
        tally.fail(f"{kind}: {why}")
        return 0.0
    if result.first_audio_s is None:
        tally.fail(f"{kind}: no audio")
        return 0.0
    tally.add(f"{kind}: {'closed at the first audio' if result.hung_up else 'served'}")
    return 0.0


@contextlib.asynccontextmanager
async def websocket(run: Run) -> AsyncIterator[ClientConnection]:
    async with connect(run.ws_url, max_size=None, proxy=None, open_timeout=30) as ws:
        yield ws


def abort(ws: ClientConnection) -> None:
    """Drop the connection as a network failure or a killed tab does: no close frame."""
    ws.transport.abort()


async def ws_reply(
    run: Run, ws: ClientConnection, who: str, then: str = "listen"
) -> tuple[ReplyResult, float]:
    """One paced reply over the WebSocket. `then`: `listen` to the end, `cancel` at the first
    audio (barge-in, until `cancelled`), `abort` the connection at the first audio. Returns the
    result and when (perf_counter) the listener finishes hearing it."""
    uid = run.utterance_id(who)
    speak = {"type": "speak", "utterance_id": uid, **paced_answer("bidi")}
    await ws.send(orjson.dumps(speak).decode())  # a text frame
    result = ReplyResult()  # status 0: not HTTP
    listener = Listener(result)
    started = time.perf_counter()
    cancelled = False
    while True:
        frame = await ws.recv()
        now = time.perf_counter() - started
        if isinstance(frame, bytes):
            n = frame[0]
            if frame[1 : 1 + n].decode("ascii") != uid or cancelled:
                continue  # late audio of a cancelled utterance: dropped, as a client does
            listener.heard(now, (len(frame) - 1 - n) / BYTES_PER_SECOND)
            if then == "abort":
                result.hung_up = True
                abort(ws)
                return result, time.perf_counter()
            if then == "cancel" and not cancelled:
                cancelled = True
                await ws.send('{"type": "cancel"}')
            continue
        event = orjson.loads(frame)
        kind = event.get("type")
        if kind == "error":
            result.code = event.get("code")
            result.error = frame
            if result.code in REFUSAL_CODES and result.first_audio_s is None:
                result.refused = True
                result.retry_after_s = float(event.get("retry_after_s") or 1)
                return result, time.perf_counter()
            if result.code == "nothing_to_cancel":  # the reply ended before the cancel
                return result, time.perf_counter()
        elif kind == "cancelled" and event.get("utterance_id") == uid:
            return result, time.perf_counter()
        elif kind == "agent_end" and event.get("utterance_id") == uid and not cancelled:
            return result, started + listener.play_end


async def listen_then_think(rng: random.Random, until: float) -> None:
    await asyncio.sleep(max(0.0, until - time.perf_counter()) + rng.uniform(1.0, 3.0))


# --- actions -----------------------------------------------------------------------------------


async def sse_reply(run: Run, http: httpx.AsyncClient, rng: random.Random, who: str) -> None:
    started = time.perf_counter()
    result = await one_reply(http, "bidi")
    wait = judge(run.tally, "sse reply", result)
    await listen_then_think(rng, max(started + result.play_end_s, time.perf_counter() + wait))


async def ws_replies(run: Run, http: httpx.AsyncClient, rng: random.Random, who: str) -> None:
    """A WebSocket that asks once or twice, then closes (the next one is a new connection)."""
    async with websocket(run) as ws:
        for _ in range(rng.randint(1, 2)):
            result, heard = await ws_reply(run, ws, who)
            wait = judge(run.tally, "ws reply", result)
            await listen_then_think(rng, max(heard, time.perf_counter() + wait))


async def barge_in(run: Run, http: httpx.AsyncClient, rng: random.Random, who: str) -> None:
    async with websocket(run) as ws:
        result, _ = await ws_reply(run, ws, who, then="cancel")
        if result.refused:
            judge(run.tally, "barge-in", result)
            await asyncio.sleep(result.retry_after_s)
            return
        if result.code == "nothing_to_cancel":
            run.tally.add("barge-in: too late, nothing_to_cancel")
        elif result.error is not None:
            judge(run.tally, "barge-in", result)
        else:
            run.tally.add("barge-in: cancelled")
        if rng.random() < 0.5:  # the user says something else: the session goes on
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            result, heard = await ws_reply(run, ws, who)
            wait = judge(run.tally, "ws reply after a barge-in", result)
            await listen_then_think(rng, max(heard, time.perf_counter() + wait))


async def sse_hang_up(run: Run, http: httpx.AsyncClient, rng: random.Random, who: str) -> None:
    result = await one_reply(http, "bidi", hang_up=True)
    await asyncio.sleep(judge(run.tally, "sse hang-up", result) + rng.uniform(1.0, 3.0))


async def ws_hang_up(run: Run, http: httpx.AsyncClient, rng: random.Random, who: str) -> None:
    async with websocket(run) as ws:
        result, _ = await ws_reply(run, ws, who, then="abort")
    await asyncio.sleep(judge(run.tally, "ws hang-up", result) + rng.uniform(1.0, 3.0))


async def reconnect(run: Run, http: httpx.AsyncClient, rng: random.Random, who: str) -> None:
    """The network drops a WebSocket mid-reply; the client connects again at once and asks
    again. Then an EventSource reconnects after a reply's end: 204, nothing replayed."""
    async with websocket(run) as ws:
        dropped, _ = await ws_reply(run, ws, who, then="abort")
    if dropped.refused:
        judge(run.tally, "reconnect", dropped)
        await asyncio.sleep(dropped.retry_after_s)
        return
    async with websocket(run) as ws:
        result, heard = await ws_reply(run, ws, who)
    wait = judge(run.tally, "reconnect: ws asked again", result)
    again = await http.get(
        "/v1/speak/sse",
        params={"text": "Hello there.", "format": "pcm"},
        headers={"Last-Event-ID": f"{who}:7"},
    )
    expect(run.tally, "reconnect: EventSource after the end", again, 204, None)
    await listen_then_think(rng, max(heard, time.perf_counter() + wait))


def expect(
    tally: Tally, what: str, response: httpx.Response, status: int, code: str | None
) -> None:
    got = error_code(response.content) if response.content else None
    why = unexpected(response.status_code, got, text=response.text)
    if why is not None:
        tally.fail(f"{what}: {why}")
    elif is_refusal(response.status_code, got):
        tally.add(f"{what}: refused {response.status_code} {got}")
    elif (response.status_code, got) != (status, code):
        tally.fail(f"{what}: answered {response.status_code} {got}, expected {status} {code}")
    else:
        tally.add(f"{what} -> {status}{' ' + code if code else ''}")


async def bad_request(run: Run, http: httpx.AsyncClient, rng: random.Random, who: str) -> None:
    json_type = {"Content-Type": "application/json"}
    kind = rng.choice(["json", "field", "long", "type", "ws json", "ws size"])
    if kind == "json":
        r = await http.post("/v1/speak", content=b'{"text": "Hi.",', headers=json_type)
        expect(run.tally, "bad request: invalid JSON", r, 400, "invalid_json")
    elif kind == "field":
        r = await http.post("/v1/speak", json={"text": "Hi.", "colour": "blue"})
        expect(run.tally, "bad request: unknown field", r, 400, "invalid_field")
    elif kind == "long":
        r = await http.post("/v1/speak", json={"text": "Hi. " * 1300, "format": "pcm"})
        expect(run.tally, "bad request: text too long", r, 400, "text_too_long")
    elif kind == "type":
        plain = {"Content-Type": "text/plain"}
        r = await http.post("/v1/speak", content=b'{"text": "Hi."}', headers=plain)
        expect(run.tally, "bad request: text/plain", r, 415, "unsupported_media_type")
    elif kind == "ws json":
        async with websocket(run) as ws:
            await ws.send('{"type": "speak", "text": ')
            answer = orjson.loads(await ws.recv())
        what = "bad request: ws invalid JSON"
        if answer.get("type") == "error" and answer.get("code") == "invalid_json":
            run.tally.add(f"{what} -> error frame invalid_json")
        else:
            run.tally.fail(f"{what}: answered {str(answer)[:80]}")
    else:
        what = "bad request: ws message too large"
        async with websocket(run) as ws:
            big = orjson.dumps({"type": "speak", "text": "x" * run.max_message_bytes})
            await ws.send(big.decode())
            try:
                answer = await ws.recv()
                run.tally.fail(f"{what}: answered {str(answer)[:80]}")
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code == 1009:
                    run.tally.add(f"{what} -> close 1009")
                else:
                    run.tally.fail(f"{what}: closed with {code}, expected 1009")
    await asyncio.sleep(rng.uniform(0.5, 1.5))


Action = Callable[[Run, httpx.AsyncClient, random.Random, str], Awaitable[None]]
ACTIONS: dict[str, tuple[Action, float]] = {  # name -> (action, weight)
    "sse reply": (sse_reply, 30),
    "ws replies": (ws_replies, 25),
    "barge-in": (barge_in, 10),
    "sse hang-up": (sse_hang_up, 7),
    "ws hang-up": (ws_hang_up, 7),
    "reconnect": (reconnect, 8),
    "bad request": (bad_request, 13),
}


async def conversation(run: Run, who: str, rng: random.Random, stop_at: float) -> None:
    names = list(ACTIONS)
    weights = [ACTIONS[n][1] for n in names]
    async with httpx.AsyncClient(base_url=run.stack.gateway, timeout=60) as http:
        await asyncio.sleep(rng.uniform(0, 2))  # conversations do not all start at once
        while time.perf_counter() < stop_at:
            name = rng.choices(names, weights)[0]
            try:
                async with asyncio.timeout(ACTION_TIMEOUT_S):
                    await ACTIONS[name][0](run, http, rng, who)
            except InvalidStatus as exc:  # the upgrade was refused
                status, code = exc.response.status_code, error_code(bytes(exc.response.body or b""))
                if not is_refusal(status, code):
                    run.tally.fail(f"{name}: upgrade refused {status} {code}")
                    continue
                run.tally.add(f"{name}: refused {status} {code}")
                await asyncio.sleep(float(exc.response.headers.get("Retry-After", "1")))
            except TimeoutError:
                run.tally.fail(f"{name}: no answer in {ACTION_TIMEOUT_S:.0f} s")
            except (httpx.HTTPError, WebSocketException, OSError) as exc:
                if 1011 in _close_codes(exc):
                    run.tally.fail(f"{name}: WebSocket closed with 1011")
                else:
                    run.tally.fail(f"{name}: {type(exc).__name__} {str(exc)[:80]}")
                await asyncio.sleep(1)
            except asyncio.CancelledError:
                run.tally.add("cut at the end of the run")
                raise


def _close_codes(exc: BaseException) -> set[int]:
    if isinstance(exc, ConnectionClosed):
        return {f.code for f in (exc.rcvd, exc.sent) if f is not None}
    return set()


# --- sampling -------------------------------------------------------------------------------------


async def sample(http: httpx.AsyncClient, run: Run, t_s: float) -> Sample | None:
    assert run.stack.gateway_internal is not None
    try:
        gw, ms = await asyncio.gather(
            http.get(run.stack.gateway_internal + "/metrics"),
            http.get(run.stack.model_server + "/metrics"),
        )
        gw.raise_for_status()
        ms.raise_for_status()
    except httpx.HTTPError as exc:
        run.tally.fail(f"metrics scrape: {type(exc).__name__}")
        return None
    return Sample(t_s, read_metrics(gw.text), read_metrics(ms.text))


def progress(s: Sample, tally: Tally) -> str:
    g, m = s.gateway, s.model_server
    served = tally.served()
    return (
        f"  t {s.t_s:6.0f} s  gateway {g.rss_bytes / 2**20:6.1f} MiB {g.fds:3.0f} fds "
        f"{g.tasks:3.0f} tasks {g.threads:2.0f} thr | model server {m.rss_bytes / 2**20:6.1f} MiB "
        f"{m.fds:3.0f} fds {m.tasks:3.0f} tasks {m.threads:2.0f} thr | "
        f"{sum(tally.outcomes.values())} outcomes, {served} served, "
        f"{sum(tally.unexpected.values())} unexpected"
    )


async def soak(
    run: Run, times: list[float], conversations: str, seed: int
) -> tuple[list[Sample], Sample | None, int]:
    """Runs the load until the last of `times` (seconds from its start, when to sample);
    returns the samples, one more after the load has drained, and N."""
    tally = run.tally
    async with httpx.AsyncClient(timeout=30) as http:
        async with httpx.AsyncClient(base_url=run.stack.gateway, timeout=60) as gw:
            judge(tally, "warm-up reply", await one_reply(gw, "bidi"))
        if conversations == "auto":
            load = (await http.get(run.stack.model_server + "/load")).json()
            streams = float(load["realtime_streams"])
            n = max(1, math.floor(streams))
            print(f"soak: {n} conversations (the model server's realtime_streams: {streams})")
        else:
            n = int(conversations)
        rng = random.Random(seed)
        t0 = time.perf_counter()
        stop_at = t0 + times[-1]
        tasks = [
            asyncio.create_task(conversation(run, f"c{i}", random.Random(rng.random()), stop_at))
            for i in range(n)
        ]
        samples: list[Sample] = []
        for t in times:
            await asyncio.sleep(max(0.0, t0 + t - time.perf_counter()))
            if (s := await sample(http, run, t)) is not None:
                samples.append(s)
                print(progress(s, tally), flush=True)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(3)  # what the cut replies leave behind has gone by now
        drained = await sample(http, run, time.perf_counter() - t0)
    return samples, drained, n


def plot(samples: list[Sample], duration_s: float, rules: Rules, title: str, path: Path) -> None:
    """Both services' four gauges against time, with warm-up and the compared windows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [s.t_s / 60 for s in samples]
    compared = windows(samples, duration_s, rules)
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    panels = [
        ("rss_bytes", "RSS (MiB)"),
        ("fds", "open descriptors"),
        ("tasks", "asyncio tasks"),
        ("threads", "threads"),
    ]
    for ax, (gauge, label) in zip(axes.flat, panels, strict=True):
        for service, name in (("gateway", "gateway"), ("model_server", "model server")):
            values = [s.of(service).gauge(gauge) for s in samples]
            if gauge == "rss_bytes":
                values = [v / 2**20 for v in values]
            ax.plot(minutes, values, marker=".", label=name)
        ax.axvspan(0, rules.warmup(duration_s) / 60, color="grey", alpha=0.15, label="warm-up")
        if compared is not None:
            for window, color, what in ((compared.baseline, "tab:green", "baseline"),
                                        (compared.end, "tab:red", "end")):  # fmt: skip
                start, stop = window[0].t_s / 60, window[-1].t_s / 60
                ax.axvspan(start, stop, color=color, alpha=0.12, label=what)
        ax.set(ylabel=label, title=label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("minutes")
    axes[0][0].legend(fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", default="30m", help="e.g. 90s, 30m, 2h")
    parser.add_argument(
        "--conversations", default="auto", help="at once; auto: the model server's realtime_streams"
    )
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--max-message-bytes", type=int, default=16_384, help="the gateway's")
    parser.add_argument("--model-args", default="", help="more model server flags")
    parser.add_argument("--gateway-args", default="", help="more gateway flags")
    parser.add_argument("--logs", type=Path, help="where the services' logs go (a temp dir)")
    parser.add_argument(
        "--plot",
        type=Path,
        help="where the plot goes (docs/soak.png for runs of 10 minutes "
        "or more, the logs' folder for a shorter smoke test)",
    )
    args = parser.parse_args()
    try:
        duration_s = parse_duration(args.duration)
    except ValueError as exc:
        parser.error(str(exc))
    if args.conversations != "auto" and not args.conversations.isdigit():
        parser.error("--conversations: a number or auto")
    log_dir = args.logs or Path(tempfile.mkdtemp(prefix="soak-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    rules = Rules()
    tally = Tally()
    gateway_flags = ["--max-message-bytes", str(args.max_message_bytes)]
    print(f"soak: {args.duration} ({duration_s:.0f} s), logs in {log_dir}", flush=True)
    with stack(
        shlex.split(args.model_args),
        [*gateway_flags, *shlex.split(args.gateway_args)],
        internal_port=free_port(),
        log_dir=log_dir,
    ) as running:
        run = Run(running, tally, args.max_message_bytes)
        samples, drained, n = asyncio.run(
            soak(run, rules.sample_times(duration_s, args.interval), args.conversations, args.seed)
        )
        seen = {service: log.stat().st_size for service, log in running.logs.items()}
        for service, log in running.logs.items():  # before stopping: shutdown is not the soak
            for line in log_problems(log.read_text(errors="replace")):
                tally.fail(f"{service} log: {line[-100:]}")
    for service, log in running.logs.items():
        with log.open("rb") as f:
            f.seek(seen[service])
            late = log_problems(f.read().decode(errors="replace"))
        if late:
            print(f"soak: {service} logged {len(late)} problem lines while stopping (not counted):")
            print("\n".join(f"  {line[-120:]}" for line in late[:4]))
    if samples:
        codes = new_error_codes(
            samples[0].gateway.errors, samples[-1].gateway.errors, REFUSAL_CODES | PROVOKED_CODES
        )
        for code, count in codes.items():
            tally.unexpected[f"gateway_errors_total{{code={code!r}}}"] += count
    print(
        f"\nsoak: {duration_s:.0f} s, {n} conversations, seed {args.seed}; samples every "
        f"{args.interval:.0f} s (RSS MiB, open descriptors, asyncio tasks, threads)\n"
    )
    print(table(samples, per_minute=duration_s > 600))
    if drained is not None:
        print("\nafter the load drained (3 s after the end):")
        print(table([drained]).splitlines()[-1])
    print("\noutcomes:")
    print(outcome_table(tally.outcomes))
    result = verdict(samples, duration_s, tally.unexpected, tally.served(), rules)
    print(f"\ngoal (warm-up {rules.warmup(duration_s):.0f} s; bench/soak_report.py):")
    print(verdict_lines(result))
    if samples:
        outcome = "PASS" if result.ok else "FAIL"
        title = f"make soak: {duration_s / 60:.1f} min, {n} conversations: {outcome}"
        where = args.plot or (Path("docs/soak.png") if duration_s >= 600 else log_dir / "soak.png")
        plot(samples, duration_s, rules, title, where)
        print(f"plot: {where}")
    sys.exit(0 if result.ok else 1)


if __name__ == "__main__":
    main()
