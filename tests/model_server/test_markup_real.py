"""Markup with the real Kokoro-82M weights (issue #51): a pause is silence of the asked length
between the words, an IPA override changes that word's phonemes only, SSML's readings are
timed on the written words, a slower rate takes longer."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import numpy as np
import pytest

from tests.support.servers import RunningServer

pytestmark = pytest.mark.real_model

RATE = 24_000
QUIET = 0.01 * 32767  # TrimPolicy's threshold, in s16


async def _timed(server: RunningServer, text: str, **extra: Any) -> tuple[np.ndarray, list[Any]]:
    body = {"text": text, "voice": "jf_alpha", "format": "pcm", "timestamps": True, **extra}
    async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
        answer = await http.post("/invocations", json=body)
    assert answer.status_code == 200, answer.text
    reply = answer.json()
    pcm = np.frombuffer(base64.b64decode(reply["audio"]), "<i2")
    return pcm, reply["words"]


def _quiet_runs(pcm: np.ndarray) -> list[tuple[int, int]]:
    """The runs of quiet samples between loud ones: (start, length)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > QUIET)
    gaps = np.diff(loud) - 1
    return [(int(loud[i]) + 1, int(g)) for i, g in enumerate(gaps) if g > 0]


async def _phonemes(server: RunningServer, text: str, **extra: Any) -> str:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
        answer = await http.post("/phonemize", json={"text": text, **extra})
    assert answer.status_code == 200, answer.text
    return str(answer.json()["phonemes"])


@pytest.mark.parametrize(
    "text",
    [
        "Hello there. [pause:1s] How are you?",
        '<speak>Hello there. <break time="1000ms"/> How are you?</speak>',
    ],
)
async def test_a_pause_is_that_silence_between_the_words(
    model_server: RunningServer, text: str
) -> None:
    pcm, words = await _timed(model_server, text)
    longest = max(_quiet_runs(pcm), key=lambda run: run[1])
    assert longest[1] / RATE == pytest.approx(1.0, abs=0.010)
    names = [w["word"] for w in words]
    assert names == ["Hello", "there.", "How", "are", "you?"]
    gap = words[2]["start_s"] - words[1]["end_s"]
    assert 1.0 <= gap <= 1.1  # the next word starts after it, where its sound begins
    plain, _ = await _timed(model_server, "Hello there. How are you?")
    assert len(pcm) - len(plain) == pytest.approx(RATE * (1.0 - 0.15), abs=RATE * 0.05)


async def test_an_ipa_override_changes_that_word_only(model_server: RunningServer) -> None:
    plain = await _phonemes(model_server, "Say Kokoro now.")
    marked = await _phonemes(model_server, "Say [Kokoro](/kˈOkəɹO/) now.")
    assert marked.split() == [plain.split()[0], "kˈOkəɹO", plain.split()[2]]
    assert "kˈOkəɹO" not in plain
    # a lexicon's entry reads the same as the inline pronunciation
    entries = {"kokoro": "/kˈOkəɹO/"}
    assert await _phonemes(model_server, "Say Kokoro now.", lexicon=entries) == marked
    _, words = await _timed(model_server, "Say [Kokoro](/kˈOkəɹO/) now.")
    assert [w["word"] for w in words] == ["Say", "Kokoro", "now."]


async def test_ssml_readings_are_timed_on_the_written_words(model_server: RunningServer) -> None:
    text = (
        '<speak>Run the <sub alias="sequel">SQL</sub> query for order '
        '<say-as interpret-as="digits">4821</say-as> now.</speak>'
    )
    _, words = await _timed(model_server, text)
    assert [w["word"] for w in words] == [
        "Run",
        "the",
        "SQL",
        "query",
        "for",
        "order",
        "4821",
        "now.",
    ]
    said = await _phonemes(model_server, text)
    spelled = "Run the sequel query for order four eight two one now."
    # read run by run between the readings: the same sounds, a stress may differ
    assert _unstressed(said) == _unstressed(await _phonemes(model_server, spelled))


def _unstressed(phonemes: str) -> str:
    return phonemes.replace("ˈ", "").replace("ˌ", "")


async def test_a_slower_rate_speaks_longer(model_server: RunningServer) -> None:
    fast, _ = await _timed(model_server, "<speak>Thank you for calling, how can I help?</speak>")
    slow, _ = await _timed(
        model_server,
        '<speak><prosody rate="slow">Thank you for calling, how can I help?</prosody></speak>',
    )
    assert len(slow) / len(fast) == pytest.approx(1 / 0.8, rel=0.1)
