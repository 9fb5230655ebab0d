"""The demo page and speak.js in real headless Chromium (Debian's), driven by Playwright.

The gateway runs in front of the model server with the fast controllable engine: what is under
test here is the browser side (transports, players, barge-in); the real engine is covered by
the other gateway tests.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import pytest_asyncio
from playwright.async_api import Browser, ConsoleMessage, Page, Route, async_playwright
from playwright.async_api import TimeoutError as PlaywrightTimeoutError

from gateway.app import create_app as create_gateway
from gateway.config import Settings as GatewaySettings
from tests.support.fakes import FakeEngine
from tests.support.gateway_client import counted, metric
from tests.support.processes import gateway_process
from tests.support.servers import RunningServer, free_port, serve
from tests.support.split_proxy import split_proxy

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
LONG = " ".join(["This sentence is here to keep the voice busy for a little while."] * 6)

pytestmark = pytest.mark.skipif(
    shutil.which("chromium") is None, reason="Debian chromium missing: run `make browser`"
)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--autoplay-policy=no-user-gesture-required",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        await browser.close()


class Console:
    def __init__(self, page: Page) -> None:
        self.errors: list[str] = []
        page.on("console", self.on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))

    def on_console(self, msg: ConsoleMessage) -> None:
        if msg.type == "error":
            self.errors.append(msg.text)


async def open_demo(browser: Browser, base: str, query: str = "") -> tuple[Page, Console]:
    page = await browser.new_page()
    console = Console(page)
    await page.goto(f"{base}/{query}")
    await page.wait_for_function("window.demo !== undefined")
    return page, console


async def speak(page: Page, *, transport: str, fmt: str, text: str, mode: str = "bidi") -> None:
    await page.fill("#text", text)
    await page.select_option("#transport", transport)
    await page.select_option("#format", fmt)
    await page.select_option("#mode", mode)
    await page.fill("#tps", "200")
    await page.click("#speak")


async def wait_for_state(page: Page, *states: str) -> None:
    """Until the demo's state is one of `states`; failing, it says which states the page went
    through and what it showed as the error."""
    try:
        await page.wait_for_function(
            "(states) => states.includes(document.querySelector('#metrics').dataset.state)",
            arg=list(states),
            timeout=60_000,
        )
    except PlaywrightTimeoutError:
        seen = await page.evaluate(
            "[window.demo.states, document.querySelector('#error').textContent]"
        )
        raise AssertionError(
            f"never {' or '.join(states)}: went through {seen[0]}, error {seen[1]!r}"
        ) from None


async def played_proof(page: Page) -> dict[str, Any]:
    proof: dict[str, Any] = await page.evaluate(
        """() => {
            const s = window.demo.stats;
            return { state: document.querySelector('#metrics').dataset.state,
                     ttfa: document.querySelector('#metrics').dataset.ttfaMs,
                     player: s.player, maxRms: s.maxRms, playing: s.playingEvent,
                     bufferedEnd: s.bufferedEnd, bytes: s.bytes, error: s.error,
                     contextAdvance: (s.contextTimeEnd || 0) - (s.contextTimeStart || 0) };
        }"""
    )
    return proof


@pytest.mark.parametrize("transport", ["sse", "sse-fetch", "ws", "ws2"])
@pytest.mark.parametrize("fmt", ["pcm", "mp3", "aac", "opus"])
async def test_audio_plays(
    browser: Browser, gateway_on_fake: RunningServer, transport: str, fmt: str
) -> None:
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    await speak(page, transport=transport, fmt=fmt, text="Hello there. " + LONG[:120])
    await wait_for_state(page, "done", "error")
    proof = await played_proof(page)
    assert proof["error"] is None
    assert proof["state"] == "done"
    assert int(proof["ttfa"]) > 0
    assert proof["bytes"] > 0
    if fmt == "pcm":
        assert proof["player"] == "WorkletPlayer"
        assert proof["contextAdvance"] > 0.5  # the AudioContext played through the reply
        assert proof["maxRms"] > 0.1  # and the output carried energy
    else:
        assert proof["player"] == "MsePlayer"
        assert proof["playing"] is True
        assert proof["bufferedEnd"] > 0.5
    assert console.errors == []
    await page.close()


async def test_mp3_through_webcodecs_when_mse_is_not_used(
    browser: Browser, gateway_on_fake: RunningServer
) -> None:
    page, console = await open_demo(browser, gateway_on_fake.http_url, "?decoder=webcodecs")
    await speak(page, transport="ws", fmt="mp3", text="Hello there. " + LONG[:120])
    await wait_for_state(page, "done", "error")
    proof = await played_proof(page)
    assert (proof["state"], proof["player"], proof["error"]) == ("done", "WebCodecsMp3Player", None)
    assert proof["maxRms"] > 0.1
    assert console.errors == []
    await page.close()


@pytest.mark.parametrize("transport", ["ws", "ws2"])
async def test_barge_in_silences_and_cancels(
    browser: Browser, gateway_on_fake: RunningServer, fake_engine: FakeEngine, transport: str
) -> None:
    cancels_before = await metric(gateway_on_fake, "gateway_cancels_total")
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    # the first sentence speaks; the next stays in the engine until cancelled, so the reply is
    # still going when the listener stops it however slow the machine (its 4 s of audio alone
    # could play out between the first audio and the click)
    fake_engine.hold_after = 1
    await speak(page, transport=transport, fmt="pcm", text=LONG)
    await page.wait_for_function("document.querySelector('#metrics').dataset.ttfaMs !== undefined")
    await page.click("#stop")
    await wait_for_state(page, "stopped")
    await page.wait_for_function("window.demo.stats !== null")  # speak() has returned
    # silence: the worklet says when its fade is over (it drops its queue then). Watch its own
    # output reports (still connected) over a window after that: each tick counts only what
    # played after the fade, however late the audio thread runs.
    await page.wait_for_function("window.demo.stats.fadedAt !== undefined")
    after = await page.evaluate(
        """() => new Promise((resolve) => {
            const s = window.demo.stats;
            s.maxRms = 0;
            const played = s.playedSamples, ticked = s.contextTimeEnd;
            setTimeout(() => resolve({ rms: s.maxRms, played: s.playedSamples - played,
                                       ticks: s.contextTimeEnd - ticked }), 400);
        })"""
    )
    assert after["ticks"] > 0.2  # the output kept reporting during the window...
    assert after["played"] == 0  # ...and played nothing more
    assert after["rms"] == 0
    assert await metric(gateway_on_fake, "gateway_cancels_total") == cancels_before + 1
    assert console.errors == []
    await page.close()


async def test_finished_eventsource_reply_is_not_replayed(
    browser: Browser, gateway_on_fake: RunningServer
) -> None:
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/v1/speak/sse" in r.url else None)
    await speak(page, transport="sse", fmt="mp3", text="Hello there.")
    await wait_for_state(page, "done")
    # give a reconnecting EventSource its chance: it would retry within ~3 s by default
    count = await page.evaluate(
        "() => new Promise((r) => setTimeout(() => r(performance.getEntriesByType('resource')"
        ".filter((e) => e.name.includes('/v1/speak/sse')).length), 3500))"
    )
    assert count == 1
    assert len(requests) == 1
    assert console.errors == []
    await page.close()


async def test_a_page_speaks_through_a_keyed_gateway_with_a_token(
    browser: Browser, fake_server: RunningServer
) -> None:
    """The page's backend minted the token (here: the test, with the key); speak.js carries it
    on each transport: ?token= for EventSource and WebSocket, a Bearer header for fetch."""
    key = "page-backend-key-0123456789"
    settings = GatewaySettings(model_server_url=fake_server.http_url, api_keys=f"web:{key}")
    with serve(create_gateway(settings)) as keyed:
        async with httpx.AsyncClient(base_url=keyed.http_url) as http:
            minted = await http.post(
                "/v1/tokens", json={}, headers={"Authorization": f"Bearer {key}"}
            )
        token = minted.json()["token"]
        for transport in ("sse", "sse-fetch", "ws"):
            page, console = await open_demo(browser, keyed.http_url, f"?token={token}")
            await speak(page, transport=transport, fmt="pcm", text="Hello there.")
            await wait_for_state(page, "done", "error")
            proof = await played_proof(page)
            assert (proof["state"], proof["error"]) == ("done", None), transport
            assert proof["bytes"] > 0
            assert console.errors == []
            await page.close()
        assert await counted(keyed, "gateway_errors_total", code="unauthorized") == 0


@pytest.mark.parametrize(("transport", "fmt"), [("ws", "pcm"), ("sse", "mp3")])
async def test_captions_follow_the_audio_clock(
    browser: Browser, gateway_on_fake: RunningServer, transport: str, fmt: str
) -> None:
    """The word highlighted at each moment is the one whose span covers the playback time
    (from the player's clock, not from when the timings arrived, which is much earlier)."""
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    await speak(page, transport=transport, fmt=fmt, text=LONG[:200])
    await wait_for_state(page, "done", "error")
    proof = await played_proof(page)
    assert (proof["state"], proof["error"]) == ("done", None)
    log: list[dict[str, Any]] = await page.evaluate("window.demo.wordLog")
    spans = await page.eval_on_selector_all(
        "#captions span",
        "spans => spans.map(s => [Number(s.dataset.startMs), Number(s.dataset.endMs)])",
    )
    assert len(log) >= 5
    assert [e["index"] for e in log] == sorted(e["index"] for e in log)
    for entry in log:
        start, _ = spans[entry["index"]]
        assert start <= entry["playedMs"], entry
        if entry["index"] + 1 < len(spans):
            assert entry["playedMs"] < spans[entry["index"] + 1][0], entry
    assert log[-1]["index"] == len(spans) - 1  # the last word was reached
    now = await page.eval_on_selector_all("#captions span.now", "s => s.map(x => x.textContent)")
    assert len(now) == 1
    assert console.errors == []
    await page.close()


@pytest.mark.parametrize("transport", ["ws", "sse-fetch"])
async def test_stop_tells_what_was_heard(
    browser: Browser, gateway_on_fake: RunningServer, transport: str
) -> None:
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    await page.fill("#tps", "20")  # slow enough to stop it mid-way
    await page.fill("#text", LONG)
    await page.select_option("#transport", transport)
    await page.select_option("#format", "pcm")
    await page.click("#speak")
    await page.wait_for_function("window.demo.wordLog.length >= 4")
    await page.click("#stop")
    await page.wait_for_function("window.demo.heardText !== undefined")
    heard = await page.evaluate("window.demo.heardText")
    log = await page.evaluate("window.demo.wordLog")
    words_heard = heard.split()
    assert len(words_heard) >= 3  # at least the words that had finished before the stop
    assert LONG.startswith(heard)
    # every word before the last one highlighted had finished playing when Stop was clicked
    # (the highlight samples the player's clock once a frame, so it may lag the stop by a word
    # or two on a loaded machine, never lead it)
    assert len(words_heard) >= log[-1]["index"]
    shown = await page.text_content("#heard")
    assert shown == f"Heard before Stop: “{heard}”"
    assert console.errors == []
    await page.close()


async def test_the_page_reconnects_by_itself_when_the_gateway_restarts(
    browser: Browser, fake_server: RunningServer
) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    reconnected = "window.demo.connection.some((e) => e.event === 'reconnected')"
    with gateway_process(port, fake_server.http_url) as first:
        page, console = await open_demo(browser, base)
        await speak(page, transport="ws", fmt="pcm", text="Hello there.")
        await wait_for_state(page, "done", "error")
        first.send_signal(signal.SIGTERM)  # a rolling update: this instance goes away
        await asyncio.to_thread(first.wait, 30)
    await page.wait_for_function(
        "window.demo.connection.some((e) => e.event === 'reconnecting' && e.code === 1012)"
    )
    assert not await page.evaluate(reconnected)
    with gateway_process(port, fake_server.http_url):  # its replacement, same address
        await page.wait_for_function(reconnected, timeout=60_000)
        assert await page.text_content("#connection") == "Reconnected."
        await speak(page, transport="ws", fmt="pcm", text="Hello again.")
        await wait_for_state(page, "done", "error")
        proof = await played_proof(page)
        assert (proof["state"], proof["error"]) == ("done", None)
    # only the attempts made while no gateway listened
    assert not [e for e in console.errors if "WebSocket connection" not in e]
    await page.close()


@pytest.mark.parametrize("transport", ["sse-fetch", "ws"])
async def test_the_demo_says_when_the_service_is_at_capacity(
    browser: Browser, fake_server: RunningServer, transport: str
) -> None:
    settings = GatewaySettings(model_server_url=fake_server.http_url, first_audio_budget_s=0.0)
    with serve(create_gateway(settings)) as refusing:
        page, console = await open_demo(browser, refusing.http_url)
        await speak(page, transport=transport, fmt="pcm", text="Hello there.")
        await wait_for_state(page, "overloaded")
        shown = await page.text_content("#error")
        assert shown is not None
        assert shown.startswith("The voice service is busy right now: try again in ")
        assert await page.get_attribute("#error", "data-code") == "overloaded"
        await page.close()
    assert not [e for e in console.errors if "503" not in e]  # only the refused request itself


# --- the fetch-SSE reader against reads that end between CR and LF -------------------------

# Counts the body reads whose last byte is a CR, so a test can show that the browser really saw
# reads end between a CR and its LF (and not only that the proxy wrote them apart).
COUNT_CR_READS = """
(() => {
  const read = ReadableStreamDefaultReader.prototype.read;
  window.crEndedReads = 0;
  ReadableStreamDefaultReader.prototype.read = async function (...args) {
    const result = await read.apply(this, args);
    const v = result.value;
    if (v instanceof Uint8Array && v.length && v[v.length - 1] === 13) window.crEndedReads++;
    return result;
  };
})();
"""


async def reply_figures(page: Page) -> dict[str, Any]:
    figures: dict[str, Any] = await page.evaluate(
        """() => { const s = window.demo.stats;
                   return { state: s.state, error: s.error, bytes: s.bytes, chunks: s.chunks,
                            serverBytes: s.serverMetrics && s.serverMetrics.audio_bytes,
                            serverChunks: s.serverChunks }; }"""
    )
    return figures


@pytest.mark.parametrize("transport", ["sse-fetch", "sse", "ws"])
async def test_every_audio_chunk_arrives_when_each_crlf_is_split_across_reads(
    browser: Browser, gateway_on_fake: RunningServer, transport: str
) -> None:
    """sse-starlette ends lines with CRLF; a read may end between the CR and the LF. Through a
    proxy that writes every CR apart from what follows it, the reply arrives whole: the same
    audio chunks and bytes as on the direct path, all the gateway says it sent. In batch mode:
    one synthesis call, so both paths get the same audio (in bidi the chunk plan adapts to
    timing, and the two replies may differ by a chunk). EventSource and the WebSocket parse
    inside the browser; they are here as the control."""
    text = "Hello there. " + LONG[:120]
    seen: list[dict[str, Any]] = []
    with split_proxy(gateway_on_fake.port) as proxy:
        for base in (gateway_on_fake.http_url, proxy.http_url):
            page = await browser.new_page()
            await page.add_init_script(COUNT_CR_READS)
            console = Console(page)
            await page.goto(f"{base}/")
            await page.wait_for_function("window.demo !== undefined")
            await speak(page, transport=transport, fmt="mp3", text=text, mode="batch")
            await wait_for_state(page, "done", "error")
            seen.append(
                {**await reply_figures(page), "crReads": await page.evaluate("crEndedReads")}
            )
            assert console.errors == []
            await page.close()
        assert proxy.split_writes > 0
    direct, split = seen
    assert (direct["state"], direct["error"]) == ("done", None)
    assert (split["state"], split["error"]) == ("done", None)
    # every audio chunk the gateway sent arrived, with all its bytes, as on the direct path
    assert split["chunks"] == split["serverChunks"] > 0, seen
    assert split["bytes"] == split["serverBytes"], seen
    assert direct["chunks"] == direct["serverChunks"], seen
    assert split["bytes"] == direct["bytes"], seen
    assert split["chunks"] == direct["chunks"], seen
    if transport == "sse-fetch":  # the page's own reads (EventSource reads inside the browser)
        assert split["crReads"] > 0  # reads did end between a CR and its LF


# --- a format the browser cannot play leaves the speaker usable -----------------------------

SPEAK_AN_UNPLAYABLE_FORMAT_THEN_PCM = """
async ([transport, format, refuseMse]) => {
  const { Speaker } = await import("/static/speak.js");
  if (refuseMse) MediaSource.isTypeSupported = () => false;  // as a browser without it would
  const speaker = new Speaker({ transport });
  const errors = [];
  const states = [];
  speaker.addEventListener("error", (e) => errors.push(e.detail));
  speaker.addEventListener("state", (e) => states.push(e.detail.state));
  const refused = await speaker.speak({ text: "Hello there.", format });
  const stopped = await speaker.stop();
  const next = await speaker.speak({ text: "Hello there.", format: "pcm" });
  speaker.close();
  return { errors, states, stopped,
           refused: { state: refused.state, error: refused.error, bytes: refused.bytes },
           next: { state: next.state, error: next.error, bytes: next.bytes, player: next.player } };
}
"""


@pytest.mark.parametrize(
    ("transport", "fmt", "refuse_mse"),
    [
        ("sse", "wav", False),
        ("sse-fetch", "wav", False),
        ("ws", "wav", False),
        ("sse-fetch", "aac", True),
    ],
)
async def test_a_format_that_cannot_play_is_an_error_and_the_speaker_stays_usable(
    browser: Browser, gateway_on_fake: RunningServer, transport: str, fmt: str, refuse_mse: bool
) -> None:
    """`wav` is a browser format of the gateway that no player here takes (MSE has no
    audio/wav); `aac` with MSE refusing it is a browser without that type. Either way the
    caller hears of it through an `error` event and the resolved stats, and the next `stop()`,
    `speak()` and `close()` work."""
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    result = await page.evaluate(SPEAK_AN_UNPLAYABLE_FORMAT_THEN_PCM, [transport, fmt, refuse_mse])
    assert [e["message"] for e in result["errors"]] == [f"format {fmt} cannot play here"]
    assert result["refused"] == {
        "state": "error",
        "error": f"format {fmt} cannot play here",
        "bytes": 0,
    }
    assert result["stopped"] is None  # nothing was playing
    assert result["next"]["state"] == "done"
    assert result["next"]["error"] is None
    assert result["next"]["bytes"] > 0
    assert result["next"]["player"] == "WorkletPlayer"
    assert result["states"][0] == "error"
    assert result["states"][-1] == "done"
    assert console.errors == []
    await page.close()


STOP_THEN_A_LATE_FAILURE = """
async ([text]) => {
  const { Speaker } = await import("/static/speak.js");
  const speaker = new Speaker({ transport: "ws" });
  const states = [], errors = [];
  speaker.addEventListener("state", (e) => states.push(e.detail.state));
  speaker.addEventListener("error", (e) => errors.push(e.detail.message));
  const heard = new Promise((resolve) => speaker.addEventListener("heard", () => resolve(true)));
  const spoken = speaker.speak({ text, format: "pcm", echo_tps: 200, echo_first_ms: 300 });
  if (await Promise.race([heard, spoken.then(() => false)])) {
    const reply = speaker.current;
    await speaker.stop();
    // what a gateway or a broken connection may still say of it: the listener is not told
    reply.receive("error", { code: "tts_error", message: "late", retryable: true });
    reply.fail("WebSocket closed", { ended: true });
  }
  const stats = await spoken;
  speaker.close();
  return { states, errors, state: stats.state, error: stats.error };
}
"""


async def test_a_stopped_reply_stays_stopped_whatever_fails_after(
    browser: Browser, gateway_on_fake: RunningServer
) -> None:
    """Barge-in is the listener's: an error the gateway or the connection reports of that
    reply afterwards changes neither its state nor its stats, and is no `error` event."""
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    result = await page.evaluate(STOP_THEN_A_LATE_FAILURE, [LONG])
    assert result == {
        "states": ["playing", "stopped"],
        "errors": [],
        "state": "stopped",
        "error": None,
    }
    assert console.errors == []
    await page.close()


# --- the SSE decoder, pure, in the browser ---------------------------------------------------

SSE_CASES: list[tuple[str, list[dict[str, str]]]] = [
    (  # as sse-starlette writes it
        'event: audio_chunk\r\ndata: {"seq":0}\r\nid: u:1\r\n\r\n'
        "event: agent_end\r\ndata: {}\r\nid: u:2\r\n\r\n",
        [
            {"event": "audio_chunk", "data": '{"seq":0}', "id": "u:1"},
            {"event": "agent_end", "data": "{}", "id": "u:2"},
        ],
    ),
    (  # LF, CR and CRLF line ends mixed; a comment; a field with no colon
        "data: a\ndata: b\n\nevent: x\rdata: c\r\r: a comment\r\ndata\r\n\r\n",
        [
            {"event": "message", "data": "a\nb", "id": ""},
            {"event": "x", "data": "c", "id": ""},
            {"event": "message", "data": "", "id": ""},
        ],
    ),
    (  # a BOM; no space after the colon; an event with no data is none; an unfinished one
        "\ufeffdata:one\r\n\r\n\r\nevent: lonely\r\n\r\ndata: two\r\nid: 7\r\n\r\ndata: cut",
        [
            {"event": "message", "data": "one", "id": ""},
            {"event": "message", "data": "two", "id": "7"},
        ],
    ),
    (  # CR CR LF: a line, then a blank line; ids persist, one with NUL is ignored
        "id: 1\r\ndata: a\r\r\nid: x\x00y\r\ndata: b: é 🎵\r\n\r\ndata:  two spaces\r\n\r\n",
        [
            {"event": "message", "data": "a", "id": "1"},
            {"event": "message", "data": "b: é 🎵", "id": "1"},
            {"event": "message", "data": " two spaces", "id": "1"},
        ],
    ),
]

DECODE_EVERY_WAY = """
async (cases) => {
  const { SseDecoder } = await import("/static/speak.js");
  const decode = (pieces) => {
    const d = new SseDecoder();
    return [...pieces.flatMap((p) => d.push(p)), ...d.end()];
  };
  const decodeBytes = (bytes, cuts) => {  // as fetch SSE reads: one streaming TextDecoder
    const d = new SseDecoder();
    const text = new TextDecoder();
    const events = [];
    let at = 0;
    for (const cut of [...cuts, bytes.length]) {
      events.push(...d.push(text.decode(bytes.subarray(at, cut), { stream: true })));
      at = cut;
    }
    return [...events, ...d.push(text.decode()), ...d.end()];
  };
  const results = [];
  for (const input of cases) {
    const whole = decode([input]);
    const want = JSON.stringify(whole);
    const differ = [];
    const n = input.length;
    for (let i = 0; i <= n; i++) {
      for (let j = i; j <= n; j++) {  // every cut in two or three pieces
        const got = JSON.stringify(decode([input.slice(0, i), input.slice(i, j), input.slice(j)]));
        if (got !== want) differ.push(`text cut at ${i},${j}: ${got}`);
      }
    }
    const oneByOne = JSON.stringify(decode([...input]));
    if (oneByOne !== want) differ.push(`one character at a time: ${oneByOne}`);
    const bytes = new TextEncoder().encode(input);
    for (let i = 0; i <= bytes.length; i++) {
      const got = JSON.stringify(decodeBytes(bytes, [i]));
      if (got !== want) differ.push(`bytes cut at ${i}: ${got}`);
    }
    results.push({ whole, differ: differ.slice(0, 5), tried: (n + 1) * (n + 2) / 2 });
  }
  return results;
}
"""


async def test_the_sse_decoder_gives_the_same_events_wherever_the_reads_are_cut(
    browser: Browser, gateway_on_fake: RunningServer
) -> None:
    """SseDecoder (speak.js) against the WHATWG event-stream rules: each input decoded whole
    gives the events expected, and cut in two or three pieces at every position (as text, and
    as UTF-8 bytes through a streaming TextDecoder, as fetch SSE reads it), or fed one
    character at a time, gives the same events."""
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    results = await page.evaluate(DECODE_EVERY_WAY, [text for text, _ in SSE_CASES])
    for (text, expected), result in zip(SSE_CASES, results, strict=True):
        assert result["whole"] == expected, text
        assert result["differ"] == [], text
        assert result["tried"] > 100
    assert console.errors == []
    await page.close()


async def test_a_fetch_sse_stream_that_ends_before_the_reply_did_is_an_error(
    browser: Browser, gateway_on_fake: RunningServer
) -> None:
    """A stream that stops before `agent_end` (a proxy or the network cut it) ends the reply
    with an error instead of leaving it waiting; the next reply plays."""
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    cut = 'event: agent_start\r\ndata: {"mode": "bidi", "utterance_id": "u1"}\r\nid: u1:0\r\n\r\n'

    async def cut_short(route: Route) -> None:
        await route.fulfill(status=200, content_type="text/event-stream", body=cut)

    await page.route("**/v1/speak", cut_short)
    await speak(page, transport="sse-fetch", fmt="pcm", text="Hello there.")
    await wait_for_state(page, "done", "error")
    proof = await played_proof(page)
    assert (proof["state"], proof["error"]) == ("error", "event stream ended before the reply did")
    await page.unroute("**/v1/speak", cut_short)
    await speak(page, transport="sse-fetch", fmt="pcm", text="Hello there.")
    await wait_for_state(page, "done")
    proof = await played_proof(page)
    assert (proof["error"], proof["bytes"] > 0) == (None, True)
    assert console.errors == []
    await page.close()


async def test_the_language_picker_offers_a_sample_and_asks_for_the_language(
    browser: Browser, gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if "/v1/speak/sse" in r.url else None)
    await page.select_option("#language", "es")
    sample = await page.input_value("#text")
    assert sample.startswith("Su pedido salió ayer")  # offered over the page's own text
    await page.fill("#text", "Hola, buenos días.")
    await page.select_option("#language", "fr")
    assert await page.input_value("#text") == "Hola, buenos días."  # never over the listener's
    await page.select_option("#language", "es")
    fake_engine.reset()
    await page.select_option("#transport", "sse")
    await page.select_option("#format", "pcm")
    await page.click("#speak")
    await wait_for_state(page, "done")
    assert len(requests) == 1
    assert "language=es" in requests[0]
    assert "".join(fake_engine.calls).replace(" ", "") == "Hola,buenosdías."
    assert console.errors == []
    await page.close()


async def test_the_markup_examples_are_voiced_not_read(
    browser: Browser, gateway_on_fake: RunningServer, fake_engine: FakeEngine
) -> None:
    page, console = await open_demo(browser, gateway_on_fake.http_url)
    await page.select_option("#example", "ipa")
    assert "[Kokoro](/kˈOkəɹO/)" in await page.input_value("#text")
    await page.select_option("#example", "pause")  # offered over the page's own example
    assert "[pause:1s]" in await page.input_value("#text")
    fake_engine.reset()
    await page.select_option("#transport", "sse")
    await page.select_option("#format", "pcm")
    await page.click("#speak")
    await wait_for_state(page, "done")
    # the pause is between two engine calls, neither of which reads the brackets
    assert fake_engine.calls == ["Let me check that for you.", "Your order shipped this morning."]
    captions = await page.text_content("#captions") or ""
    assert "pause" not in captions
    assert "morning" in captions
    assert console.errors == []
    await page.close()
