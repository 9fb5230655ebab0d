"""`POST /phonemize`: what the G2P makes of a text, nothing voiced (the fake server's G2P is the
identity, so its phonemes are the text; tests/model_server/test_real_model.py has the real
G2P's), and clean errors for bad bodies."""

from __future__ import annotations

import httpx
import pytest

from tests.support.fakes import FakeEngine
from tests.support.servers import RunningServer


async def test_phonemes_and_segments_of_a_text_nothing_voiced(
    fake_server: RunningServer, fake_engine: FakeEngine
) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        english = await http.post("/phonemize", json={"text": "Hello there. How are you?"})
        japanese = await http.post("/phonemize", json={"text": "こんにちは。元気ですか？"})
        spanish = await http.post("/phonemize", json={"text": "Hola.", "language": "e"})
        voiced = await http.post("/phonemize", json={"text": "Hola.", "voice": "jf_alpha"})
        asked = await http.post("/phonemize", json={"text": "Hai.", "language": "ja"})
        blend = await http.post("/phonemize", json={"text": "Hi.", "voice": "jf_alpha+af_test(2)"})
    assert english.status_code == 200
    assert english.json() == {
        "language": "en-us",
        "voice": "af_test",
        "g2p": "identity",
        "phonemes": "Hello there. How are you?",
        "segments": ["Hello there.", "How are you?"],
    }
    assert japanese.json()["language"] == "ja"  # by its script
    # asked for: by its ISO name in the answer; no Spanish voice here, so the default's
    assert (spanish.json()["language"], spanish.json()["voice"]) == ("es", "af_test")
    # a Japanese voice reads Latin text in English; Japanese asked with no voice: its voice
    assert (voiced.json()["language"], voiced.json()["voice"]) == ("en-us", "jf_alpha")
    assert (asked.json()["language"], asked.json()["voice"]) == ("ja", "jf_alpha")
    # a blend, by its canonical name
    assert blend.json()["voice"] == "af_test(2)+jf_alpha(1)"
    assert fake_engine.calls == []  # nothing voiced


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"not json", "invalid_json"),
        (b"[1, 2]", "not_an_object"),
        (b"{}", "missing_text"),
        (b'{"text": "   "}', "empty_text"),
        (b'{"text": 5}', "invalid_field"),
        (b'{"text": "' + b"a" * 6000 + b'"}', "text_too_long"),
        (b'{"text": "Hi.", "language": "klingon"}', "unknown_language"),
        (b'{"text": "Hi.", "language": 3}', "invalid_field"),
        (b'{"text": "Hi.", "voice": "nobody"}', "unknown_voice"),
        (b'{"text": "Hi.", "normalize": "maybe"}', "invalid_field"),
        (b'{"text": "Hi.", "voice": "jf_alpha+nobody"}', "unknown_voice"),
        (b'{"text": "Hi.", "voice": "jf_alpha(0)+af_test"}', "invalid_voice"),
    ],
)
async def test_a_bad_body_is_a_clear_400(
    fake_server: RunningServer, body: bytes, code: str
) -> None:
    async with httpx.AsyncClient(base_url=fake_server.http_url) as http:
        response = await http.post("/phonemize", content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == code
    assert "Traceback" not in response.text
