from __future__ import annotations

import orjson
import pytest

from kokoro_contract import languages
from kokoro_contract.errors import InvalidRequest
from kokoro_contract.protocol import (
    ProtocolError,
    RequestRules,
    SynthesisRequest,
    TextOptions,
    invocation_body,
    synthesize_message,
    validate_synthesis,
)


@pytest.mark.parametrize(
    ("asked", "name"),
    [
        ("a", "en-us"),
        ("en-us", "en-us"),
        ("EN_US", "en-us"),
        ("en", "en-us"),
        ("b", "en-gb"),
        ("en-gb", "en-gb"),
        ("j", "ja"),
        ("ja", "ja"),
        ("z", "zh"),
        ("zh", "zh"),
        ("cmn", "zh"),
        ("e", "es"),
        ("es", "es"),
        ("f", "fr"),
        ("fr-fr", "fr"),
        ("h", "hi"),
        ("i", "it"),
        ("p", "pt-br"),
        ("pt", "pt-br"),
        (" pt-BR ", "pt-br"),
        (None, None),
        ("", None),  # as none: the voice's
    ],
)
def test_a_language_by_kokoros_letter_or_its_iso_name(asked: str | None, name: str | None) -> None:
    assert languages.check_language(asked) == name


@pytest.mark.parametrize(
    ("asked", "code", "says"),
    [
        ("klingon", "unknown_language", "unknown language 'klingon'; use one of en-us (a), en-gb"),
        ("x", "unknown_language", "unknown language 'x'"),
        (7, "invalid_field", "field 'language' must be a string"),
        (["es"], "invalid_field", "field 'language' must be a string"),
    ],
)
def test_an_unknown_language_is_refused_naming_those_there_are(
    asked: object, code: str, says: str
) -> None:
    with pytest.raises(InvalidRequest) as refused:
        languages.check_language(asked)
    assert refused.value.code == code
    assert refused.value.message.startswith(says)


def test_a_voice_implies_its_language_by_its_first_letter() -> None:
    assert languages.of_voice("ef_dora") == languages.BY_NAME["es"]
    assert languages.of_voice("jm_kumo") == languages.BY_NAME["ja"]
    assert languages.of_voice("bm_george") == languages.BY_NAME["en-gb"]
    assert languages.of_voice("alloy") is None
    assert languages.of_voice("xf_none") is None


VOICES = frozenset({"jf_alpha", "jm_kumo", "af_heart", "ef_dora"})


@pytest.mark.parametrize(
    ("language", "voice"),
    [
        (None, "jf_alpha"),  # the default
        ("ja", "jf_alpha"),  # the default speaks it
        ("es", "ef_dora"),  # the first that does
        ("en-us", "af_heart"),
        ("fr", "jf_alpha"),  # none does: the default anyway
    ],
)
def test_the_default_voice_follows_the_language(language: str | None, voice: str) -> None:
    assert languages.voice_for(language, VOICES, "jf_alpha") == voice


RULES = RequestRules(voices=VOICES, default_voice="jf_alpha")


def test_a_synthesis_request_carries_its_language_and_the_voice_that_speaks_it() -> None:
    request = validate_synthesis({"text": "Hola.", "language": "e"}, RULES)
    assert isinstance(request, SynthesisRequest)
    assert (request.language, request.voice) == ("es", "ef_dora")
    asked = validate_synthesis({"text": "Hola.", "language": "es", "voice": "jm_kumo"}, RULES)
    assert isinstance(asked, SynthesisRequest)
    assert (asked.language, asked.voice) == ("es", "jm_kumo")  # a voice asked is kept
    plain = validate_synthesis({"text": "Hello."}, RULES)
    assert isinstance(plain, SynthesisRequest)
    assert (plain.language, plain.voice) == (None, "jf_alpha")


def test_an_unknown_language_is_a_protocol_error_with_its_code() -> None:
    error = validate_synthesis({"text": "Hi.", "language": "xx", "request_id": "r1"}, RULES)
    assert isinstance(error, ProtocolError)
    assert (error.code, error.request_id) == ("unknown_language", "r1")


def test_the_clients_messages_carry_the_text_options_only_when_asked() -> None:
    spanish = TextOptions(language="es")
    with_it = orjson.loads(synthesize_message("Hola.", "r1", options=spanish))
    assert with_it == {"text": "Hola.", "request_id": "r1", "language": "es"}
    raw = orjson.loads(synthesize_message("Hi.", "r1", options=TextOptions(normalize="off")))
    assert raw == {"text": "Hi.", "request_id": "r1", "normalize": "off"}
    plain = {"text": "Hi.", "request_id": "r1"}  # the same bytes as before the options were
    assert orjson.loads(synthesize_message("Hi.", "r1", options=TextOptions())) == plain
    assert orjson.loads(synthesize_message("Hi.", "r1")) == plain
    assert invocation_body("Hola.", None, 1.0, options=spanish)["language"] == "es"
    assert "language" not in invocation_body("Hi.", None, 1.0)


@pytest.mark.parametrize(("asked", "normalize"), [(None, "auto"), ("on", "on"), ("off", "off")])
def test_a_synthesis_request_says_how_its_text_is_normalised(
    asked: str | None, normalize: str
) -> None:
    body = {"text": "Hi."} if asked is None else {"text": "Hi.", "normalize": asked}
    request = validate_synthesis(body, RULES)
    assert isinstance(request, SynthesisRequest)
    assert request.normalize == normalize


@pytest.mark.parametrize("asked", ["yes", True, 1, "OFF"])
def test_a_bad_normalize_is_refused(asked: object) -> None:
    error = validate_synthesis({"text": "Hi.", "normalize": asked}, RULES)
    assert isinstance(error, ProtocolError)
    assert error.code == "invalid_field"
    assert "auto, on, off" in error.message
