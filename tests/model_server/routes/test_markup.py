"""Markup on the model server's routes over the fake engine (issue #51): the engine voices the
runs between the constructs, a pause is that many samples of silence less the margins trimming
keeps, a rate is the segment's speed, and bad markup is a clear error before any audio (the
WebSocket session stays usable). The real weights: tests/model_server/test_markup_real.py."""

from __future__ import annotations

import base64
import io
import wave
from typing import Any

import httpx
import orjson
import pytest
from websockets.asyncio.client import connect

from kokoro_contract.markup import Pause, Said, Words, parse
from model_server.audio import TrimPolicy
from model_server.synthesis import SegmentPlan
from model_server.text import marked
from model_server.text.words import WordMap
from tests.support.fakes import FakeEngine, IdentityG2P, expected_pcm_bytes, frame_samples
from tests.support.model_server_client import read_until_terminal, synth
from tests.support.servers import RunningServer

RATE = 24_000
MARGINS = round((TrimPolicy().lead_s + TrimPolicy().tail_s) * RATE)


# --- reading the items (text/marked.py) --------------------------------------------------------


def test_a_plain_text_reads_as_one_part_as_before() -> None:
    reading = marked.read(parse("Hello there. How are you?"), IdentityG2P(), timestamps=True)
    assert reading == marked.Reading(
        (
            marked.Part(
                "Hello there. How are you?",
                WordMap(
                    "Hello there. How are you?",
                    ("Hello", "there.", "How", "are", "you?"),
                    ((0, 5), (6, 11), (13, 16), (17, 20), (21, 24)),
                ),
            ),
        )
    )


def test_parts_at_pauses_and_rates_and_words_said_as_written() -> None:
    items = (
        Pause(0.2),
        Words("Call "),
        Said("SQL", alias="sequel"),
        Words(" now."),
        Pause(1.0),
        Pause(0.5),
        Words("Slowly ", 0.8),
        Said("Kokoro", ipa="kˈOkəɹO", rate=0.8),
        Pause(0.3),
    )
    reading = marked.read(items, IdentityG2P(), timestamps=True)
    assert [(p.phonemes, p.rate, p.pause_s) for p in reading.parts] == [
        ("Call sequel now.", 1.0, 0.2),
        ("Slowly kˈOkəɹO", 0.8, 1.5),
    ]
    assert reading.pause_after_s == 0.3
    first, second = (p.words for p in reading.parts)
    assert first is not None
    assert second is not None
    assert first.words == ("Call", "SQL", "now.")
    assert [first.phonemes[a:b] for a, b in first.spans] == ["Call", "sequel", "now"]
    assert [second.phonemes[a:b] for a, b in second.spans] == ["Slowly", "kˈOkəɹO"]
    joined = marked.join_maps([first, second])
    assert joined.phonemes == reading.phonemes == "Call sequel now. Slowly kˈOkəɹO"
    assert [joined.phonemes[a:b] for a, b in joined.spans] == [
        "Call",
        "sequel",
        "now",
        "Slowly",
        "kˈOkəɹO",
    ]


def test_a_segment_plans_speed_is_within_the_models_range() -> None:
    plan = SegmentPlan(("a", "b"), None, (0.4, 1.5), (0, 0, 0))
    assert plan.speed(0, 1.0) == 0.5  # MIN_SPEED
    assert plan.speed(1, 1.5) == 2.0  # MAX_SPEED
    assert SegmentPlan(("a",)).speed(0, 1.2) == 1.2


# --- on the routes -----------------------------------------------------------------------------


async def _invoke(server: RunningServer, text: str, **extra: Any) -> httpx.Response:
    body = {"text": text, "format": "pcm", "timestamps": True, **extra}
    async with httpx.AsyncClient(base_url=server.http_url) as http:
        return await http.post("/invocations", json=body)


async def test_a_pause_is_silence_of_the_asked_length_between_the_runs(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    answer = await _invoke(fake_server, "Hello there. [pause:1.5s] How are you?")
    assert answer.status_code == 200
    reply = answer.json()
    pcm = base64.b64decode(reply["audio"])
    silence = round(1.5 * RATE) - MARGINS
    assert fake_engine.calls == ["Hello there.", "How are you?"]
    assert len(pcm) == expected_pcm_bytes("Hello there.") + 2 * silence + expected_pcm_bytes(
        "How are you?"
    )
    start = expected_pcm_bytes("Hello there.")
    assert pcm[start : start + 2 * silence] == bytes(2 * silence)  # exact digital silence
    words = reply["words"]
    assert [w["word"] for w in words] == ["Hello", "there.", "How", "are", "you?"]
    # the square wave is loud to its last sample: the quiet between is tail + pause
    gap = words[2]["start_s"] - words[1]["end_s"]
    # (a sentence's full stop has its frames too, which belong to no word)
    assert gap == pytest.approx(1.5 - TrimPolicy().lead_s, abs=0.015)


async def test_a_rate_is_its_segments_speed_and_an_ipa_word_is_voiced_as_given(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    text = (
        '<speak><prosody rate="50%">Slow now</prosody> '
        '<phoneme ph="kˈOkəɹO">Kokoro</phoneme></speak>'
    )
    answer = await _invoke(fake_server, text)
    assert answer.status_code == 200
    pcm = base64.b64decode(answer.json()["audio"])
    assert fake_engine.calls == ["Slow now", "kˈOkəɹO"]
    slow = len("Slow now") * frame_samples(0.5) + int(TrimPolicy().tail_s * RATE)
    assert len(pcm) == 2 * slow + expected_pcm_bytes("kˈOkəɹO")
    assert [w["word"] for w in answer.json()["words"]] == ["Slow", "now", "Kokoro"]


async def test_markup_none_reads_the_brackets_as_text(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    text = "Wait [pause:1s] here."
    answer = await _invoke(fake_server, text, markup="none")
    assert answer.status_code == 200
    assert fake_engine.calls == [text]


@pytest.mark.parametrize(
    ("text", "markup", "code"),
    [
        ("Say [Zed](/zʘd/).", "strict", "invalid_ipa"),
        ("<speak>Unclosed", "strict", "invalid_markup"),
        ("Wait [pause:600s].", "auto", "pause_too_long"),
        ("Wait.", "html", "invalid_field"),
    ],
)
async def test_bad_markup_is_refused_before_any_audio(
    fake_server: RunningServer, fake_engine: FakeEngine, text: str, markup: str, code: str
) -> None:
    answer = await _invoke(fake_server, text, markup=markup)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == code
    async with connect(fake_server.ws_url + "/invocations-bidirectional-stream") as ws:
        await ws.send(synth(text, "bad", markup=markup))
        bad = await read_until_terminal(ws, "bad")
        assert bad.last["code"] == code
        assert not bad.pcm
        await ws.send(synth("Still here.", "good"))  # the session stays usable
        good = await read_until_terminal(ws, "good")
        assert good.last["type"] == "synthesis_complete"
        assert len(good.pcm) == expected_pcm_bytes("Still here.")
    assert fake_engine.calls == ["Still here."]


async def test_phonemize_shows_the_override(fake_server: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        answer = await http.post(
            "/phonemize", json={"text": "Say [Kokoro](/kˈOkəɹO/) [pause:1s] now."}
        )
    assert answer.json()["phonemes"] == "Say kˈOkəɹO now."
    assert answer.json()["segments"] == ["Say kˈOkəɹO", "now."]
    assert orjson.loads(answer.content)["g2p"] == "identity"


async def test_a_pause_is_counted_in_a_wav_as_in_pcm(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    text = "Hello there. [pause:500ms] How are you?"
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        wav = await http.post("/invocations", json={"text": text, "format": "wav"})
        pcm = await http.post("/invocations", json={"text": text, "format": "pcm"})
    with wave.open(io.BytesIO(wav.content)) as read:
        frames = read.readframes(read.getnframes())
    silence = round(0.5 * RATE) - MARGINS
    assert frames == pcm.content
    assert len(frames) == (
        expected_pcm_bytes("Hello there.") + 2 * silence + expected_pcm_bytes("How are you?")
    )
