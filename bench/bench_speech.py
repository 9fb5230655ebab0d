"""Speech control through the whole stack (docs/measured.md, "Markup, lexicons and CJK first
audio"): the real model server (Kokoro-82M int8, onnxruntime) and a gateway in front of it,
each its own process (`bench.harness.stack`), then, over the gateway's SSE route with pcm and
word timings, one run:

- pauses: `[pause:Ns]` and SSML `<break time>` between two sentences, given whole and paced
  token by token (so the markup arrives split): the longest quiet run in the audio (samples
  under the trimming threshold) and the gap between the words around it, against the pause
  asked;
- a pronunciation: `POST /phonemize` of a sentence with and without `[word](/IPA/)`, and the
  same through a lexicon: how many phoneme words differ (the goal: that word only);
- Japanese against English first audio: a two-sentence Japanese reply and an English one that
  speaks about as long, alternating, `--runs` each: the time from the request to the first
  `audio_chunk` event, and the audio's length;
- what markup costs a plain text on the model server: `markup.parse` of the quality corpus's
  replies, microseconds each.

Prints Markdown.

    .venv/bin/python -m bench.bench_speech [--runs 5] [--voice jf_alpha]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import statistics
import time
from typing import Any

import httpx
import numpy as np

from bench.harness import stack
from kokoro_contract import markup
from quality import corpus

RATE = 24_000
QUIET = 0.01 * 32767  # the model server's trimming threshold, in s16
JAPANESE = "かしこまりました。ご注文の品は昨日、ポートランドの倉庫から発送されました。"
# an English reply that speaks about as long as the Japanese one (5.9-6.2 s with jf_alpha)
ENGLISH = (
    "Certainly, I can help. Your order left our warehouse in Portland yesterday and is on its way."
)
PAUSES = {
    "inline": "Thank you for waiting, I found it. [pause:{s}s] Your order shipped this morning.",
    "ssml": '<speak>Thank you for waiting, I found it. <break time="{ms}ms"/> Your order shipped '
    "this morning.</speak>",
}


async def reply(http: httpx.AsyncClient, body: dict[str, Any]) -> tuple[float, bytes, list[Any]]:
    """Seconds to the first audio event, the reply's PCM and its word timings."""
    started = time.perf_counter()
    first: float | None = None
    pcm, words, event = bytearray(), [], ""
    async with http.stream("POST", "/v1/speak", json=body) as answer:
        async for line in answer.aiter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event in ("audio_chunk", "words"):
                data = httpx.Response(200, content=line[6:]).json()
                if event == "audio_chunk":
                    first = first or time.perf_counter() - started
                    pcm += base64.b64decode(data["data"])
                else:
                    words += data["words"]
    assert first is not None, "no audio"
    return first, bytes(pcm), words


def longest_quiet_s(pcm: bytes) -> float:
    samples = np.abs(np.frombuffer(pcm, "<i2").astype(np.int32))
    loud = np.flatnonzero(samples > QUIET)
    return float(np.max(np.diff(loud)) - 1) / RATE if loud.size > 1 else 0.0


def word_gap_s(words: list[Any]) -> float:
    """The widest gap between one word's end and the next one's start."""
    return float(max(b["start_ms"] - a["end_ms"] for a, b in itertools.pairwise(words))) / 1000


async def pauses(http: httpx.AsyncClient, voice: str) -> list[str]:
    rows = ["| pause asked | form | arrives | quiet in the audio | gap between the words |"]
    rows.append("|---:|---|---|---:|---:|")
    for seconds in (0.5, 1.0, 2.5):
        for form, template in PAUSES.items():
            text = template.format(s=seconds, ms=round(seconds * 1000))
            for paced in (False, True):
                body = {"text": text, "voice": voice, "format": "pcm", "timestamps": True}
                if paced:
                    body["echo_tps"] = 60
                _, pcm, words = await reply(http, body)
                rows.append(
                    f"| {seconds:.2f} s | {form} | {'token by token' if paced else 'whole'} | "
                    f"{longest_quiet_s(pcm):.3f} s | {word_gap_s(words):.3f} s |"
                )
    return rows


async def pronunciation(model_server: str) -> list[str]:
    async with httpx.AsyncClient(base_url=model_server, timeout=60) as http:

        async def phonemes(text: str, **extra: Any) -> list[str]:
            answer = await http.post("/phonemize", json={"text": text, **extra})
            return str(answer.json()["phonemes"]).split()

        plain = await phonemes("Please ask Kokoro about the order today.")
        inline = await phonemes("Please ask [Kokoro](/kˈOkəɹO/) about the order today.")
        lexicon = await phonemes(
            "Please ask Kokoro about the order today.", lexicon={"kokoro": "/kˈOkəɹO/"}
        )
    changed = [i for i, (a, b) in enumerate(zip(plain, inline, strict=True)) if a != b]
    return [
        f"- plain: `{' '.join(plain)}`",
        f"- `[Kokoro](/kˈOkəɹO/)`: `{' '.join(inline)}`: {len(changed)} of {len(plain)} phoneme "
        f"words differ (word {changed})",
        f"- a lexicon's `kokoro`: the same as inline: {lexicon == inline}",
    ]


async def first_audio(http: httpx.AsyncClient, voice: str, runs: int) -> list[str]:
    seen: dict[str, list[tuple[float, float]]] = {"Japanese": [], "English": []}
    for _ in range(runs):
        for name, text in (("Japanese", JAPANESE), ("English", ENGLISH)):
            first, pcm, _ = await reply(http, {"text": text, "voice": voice, "format": "pcm"})
            seen[name].append((first, len(pcm) / 2 / RATE))
    rows = ["| reply | first audio, median [min-max] | audio |", "|---|---:|---:|"]
    for name, results in seen.items():
        firsts = [f * 1000 for f, _ in results]
        rows.append(
            f"| {name} | {statistics.median(firsts):.0f} ms [{min(firsts):.0f}-"
            f"{max(firsts):.0f}] | {statistics.median(a for _, a in results):.2f} s |"
        )
    ja = statistics.median(f for f, _ in seen["Japanese"])
    en = statistics.median(f for f, _ in seen["English"])
    rows.append(f"\nJapanese / English first audio: {ja / en:.2f}x")
    return rows


def parse_cost() -> str:
    texts = [reply.text for reply in corpus.load()]
    started = time.perf_counter()
    for _ in range(20):
        for text in texts:
            markup.parse(text, "auto", markup.PHONEMES)
    each = (time.perf_counter() - started) / (20 * len(texts)) * 1e6
    return f"`markup.parse` of a plain reply (the corpus's {len(texts)}): {each:.0f} µs each"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--voice", default="jf_alpha")
    args = parser.parse_args()
    with stack(["--workers", "1"], ["--replies-per-minute", "0"]) as running:
        async with httpx.AsyncClient(base_url=running.gateway, timeout=120) as http:
            await reply(http, {"text": JAPANESE + ENGLISH, "voice": args.voice, "format": "pcm"})
            print("## Pauses\n")
            print("\n".join(await pauses(http, args.voice)))
            print("\n## A pronunciation\n")
            print("\n".join(await pronunciation(running.model_server)))
            print("\n## Japanese and English first audio\n")
            print("\n".join(await first_audio(http, args.voice, args.runs)))
    print("\n## What markup costs a plain text\n")
    print(parse_cost())


if __name__ == "__main__":
    asyncio.run(main())
