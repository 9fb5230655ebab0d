"""`make bench-demo`: the demo page as a newcomer hears it, in headless Chromium (Debian's).

Starts the stack `make dev` starts (the model server with its defaults, the gateway with
`--echo-pacing true`, each its own process), opens the demo page, leaves every control as the
page sets it (its own text, LLM-paced at 40 tokens/s, its default transport and format) and
presses Speak `--runs` times, waiting for each reply to end. Per reply, from the page's own
figures (`speak.js` measures from the press): when the first sample reached the listener
(`stats.ttfaMs`, what the page shows as first audio), when the first audio bytes arrived, and
when the reply's last text event arrived. The runs alternate quiet and busy (a process spinning
on one of the cores, as another program would), so both see the same machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import shutil
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from bench.harness import stack

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@dataclass(frozen=True)
class Heard:
    heard_ms: float  # the first sample reached the listener
    first_bytes_ms: float  # the first audio bytes arrived
    last_text_ms: float  # the reply's last text event arrived
    state: str


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy(on: bool) -> Iterator[None]:
    """One core taken by a process that spins (nothing when `on` is false)."""
    if not on:
        yield
        return
    hog = multiprocessing.get_context("spawn").Process(target=_spin, daemon=True)
    hog.start()
    try:
        yield
    finally:
        hog.kill()
        hog.join()


async def one_reply(page: Any) -> Heard:
    await page.evaluate("document.querySelector('#metrics').dataset.state = ''")
    await page.click("#speak")
    await page.wait_for_function(
        "['done', 'error'].includes(document.querySelector('#metrics').dataset.state)",
        timeout=120_000,
    )
    figures: dict[str, Any] = await page.evaluate(
        """() => { const s = window.demo.stats;
                   const t = window.demo.timeline;
                   return { heard: s.ttfaMs, bytes: s.firstAudioBytesMs, state: s.state,
                            text: t.text.length ? Math.max(...t.text) : null }; }"""
    )
    return Heard(
        float(figures["heard"] or "nan"),
        float(figures["bytes"] or "nan"),
        float(figures["text"] or "nan"),
        str(figures["state"]),
    )


async def run(
    base: str, runs: int, loads: list[bool], controls: dict[str, str]
) -> dict[bool, list[Heard]]:
    from playwright.async_api import async_playwright

    heard: dict[bool, list[Heard]] = {load: [] for load in loads}
    async with async_playwright() as p:
        browser = await p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--autoplay-policy=no-user-gesture-required", "--disable-gpu"],
        )
        page = await browser.new_page()
        await page.goto(base + "/")
        await page.wait_for_function("window.demo !== undefined")
        for control, value in controls.items():
            await page.select_option(f"#{control}", value)
        await one_reply(page)  # a first reply warms the page, the gateway and the engine
        for _ in range(runs):
            for load in loads:
                with busy(load):
                    heard[load].append(await one_reply(page))
        await browser.close()
    return heard


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} [{min(values):.0f}-{max(values):.0f}] ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="replies per row")
    parser.add_argument("--quiet-only", action="store_true", help="no busy row")
    parser.add_argument("--model-args", default="", help="more model server flags")
    parser.add_argument("--gateway-args", default="", help="more gateway flags")
    parser.add_argument("--format", default="", help="instead of the page's (pcm)")
    parser.add_argument("--transport", default="", help="instead of the page's (sse)")
    args = parser.parse_args()
    if shutil.which("chromium") is None:
        sys.exit("bench-demo: Debian's chromium is missing: run `make browser`")
    loads = [False] if args.quiet_only else [False, True]
    with stack(
        args.model_args.split(), ["--echo-pacing", "true", *args.gateway_args.split()]
    ) as services:
        controls = {"format": args.format, "transport": args.transport}
        chosen = {control: value for control, value in controls.items() if value}
        heard = asyncio.run(run(services.gateway, args.runs, loads, chosen))
    print("\nThe demo page, its own text and settings, Speak pressed; median [range]:")
    print(
        "| machine | replies | first audio heard | first audio bytes | last text "
        "| heard while text arrives |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for load, rows in heard.items():
        ok = [h for h in rows if h.state == "done"]
        if not ok:
            print(f"| {'busy' if load else 'quiet'} | 0/{len(rows)} done | | | | |")
            continue
        early = sum(h.heard_ms < h.last_text_ms for h in ok)
        print(
            f"| {'one core busy' if load else 'quiet'} | {len(ok)}/{len(rows)} "
            f"| {spread([h.heard_ms for h in ok])} | {spread([h.first_bytes_ms for h in ok])} "
            f"| {spread([h.last_text_ms for h in ok])} | {early}/{len(ok)} |"
        )


if __name__ == "__main__":
    main()
