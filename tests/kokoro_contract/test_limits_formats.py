"""`kokoro_contract.limits` and `kokoro_contract.formats`: one owner each, read by every route."""

from __future__ import annotations

import math

import pytest

from gateway.params import OpenAISpeechParams, SpeakParams, parse
from kokoro_contract import formats, limits
from kokoro_contract.errors import InvalidRequest, ServiceError, brief


@pytest.mark.parametrize(
    ("text", "code"),
    [
        (None, "missing_text"),
        (5, "invalid_field"),
        (" \n", "empty_text"),
        ("x" * 11, "text_too_long"),
    ],
)
def test_text_checks(text: object, code: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        limits.check_text(text, max_chars=10)
    assert caught.value.code == code
    assert caught.value.status == 400


def test_text_within_the_limit_passes_unchanged() -> None:
    assert limits.check_text(" ten chars ", max_chars=11) == " ten chars "


@pytest.mark.parametrize("speed", [0.49, 2.01, math.nan, math.inf, True, "1.0", [1]])
def test_speed_outside_the_range_or_not_a_number(speed: object) -> None:
    with pytest.raises(InvalidRequest) as caught:
        limits.check_speed(speed)
    assert caught.value.code == "invalid_speed"


def test_speed_bounds_and_default() -> None:
    assert limits.check_speed(None) == 1.0
    assert limits.check_speed(limits.MIN_SPEED) == 0.5
    assert limits.check_speed(2) == 2.0


def test_voice_and_request_id() -> None:
    voices = {"jf_alpha", "af_heart"}
    assert limits.check_voice(None, voices, "jf_alpha") == "jf_alpha"
    assert limits.check_voice("", voices, "jf_alpha") == "jf_alpha"
    assert limits.check_voice("af_heart", voices, "jf_alpha") == "af_heart"
    with pytest.raises(InvalidRequest, match="loaded voices: af_heart, jf_alpha"):
        limits.check_voice("xx", voices, "jf_alpha")
    assert limits.check_request_id(None) is None
    assert limits.check_request_id("r" * 128) == "r" * 128
    for bad in ("", "r" * 129, 7, "a\nb", "r\r\nX-Evil: 1", "é"):
        with pytest.raises(InvalidRequest):
            limits.check_request_id(bad)


def test_utterance_kind_ids() -> None:
    assert limits.check_utterance_id("MZ0123_a.b:c-d", "stream_sid") == "MZ0123_a.b:c-d"
    assert limits.check_utterance_id("x" * 64, "context_id") == "x" * 64
    for bad in ("", "x" * 65, "a b", "é", "a/b", 7, None):
        with pytest.raises(InvalidRequest, match="'context_id' is 1-64 characters"):
            limits.check_utterance_id(bad, "context_id")


def test_the_gateway_models_read_the_same_speed_range() -> None:
    models: list[tuple[type[SpeakParams | OpenAISpeechParams], dict[str, str]]] = [
        (SpeakParams, {}),
        (OpenAISpeechParams, {"input": "Hi."}),
    ]
    for model, fields in models:
        assert parse(model, {**fields, "speed": limits.MAX_SPEED}).speed == limits.MAX_SPEED
        with pytest.raises(ServiceError) as caught:
            parse(model, {**fields, "speed": limits.MAX_SPEED + 0.01})
        assert caught.value.code == "invalid_field"


def test_registry_names_and_who_may_ask() -> None:
    assert formats.BROWSER_FORMATS == ("pcm", "wav", "ulaw_8000", "alaw_8000", "mp3", "aac", "opus")
    assert formats.MODEL_SERVER_FORMATS == ("pcm", "wav")
    assert {name: f.name for name, f in formats.OPENAI_FORMATS.items()} == {
        "pcm": "pcm",
        "wav": "wav",
        "ulaw_8000": "ulaw_8000",
        "alaw_8000": "alaw_8000",
        "mp3": "mp3",
        "opus": "ogg",  # OpenAI's opus is Ogg
        "aac": "adts",  # and its aac is ADTS
        "flac": "flac",
    }
    assert formats.FORMATS["pcm"].mime == "audio/pcm;rate=24000;channels=1;encoding=s16le"
    assert formats.FORMATS["opus"].codec_rate == 48_000


def test_every_compressed_format_names_its_codec_and_every_browser_format_plays() -> None:
    for fmt in formats.FORMATS.values():
        assert fmt.mime.startswith("audio/")
        assert (fmt.codec is None) == (fmt.name in ("pcm", "wav"))
        assert fmt.browser or fmt.openai is not None, f"{fmt.name} is offered to nobody"


def test_the_request_params_take_formats_from_the_registry() -> None:
    assert parse(SpeakParams, {"format": "opus"}).audio_format is formats.FORMATS["opus"]
    with pytest.raises(ServiceError, match="use one of pcm, wav, ulaw_8000, alaw_8000, mp3,"):
        parse(SpeakParams, {"format": "ogg"})  # OpenAI-only
    assert (
        parse(OpenAISpeechParams, {"input": "Hi.", "response_format": "aac"}).audio_format
        is (formats.FORMATS["adts"])
    )
    with pytest.raises(ServiceError):
        parse(OpenAISpeechParams, {"input": "Hi.", "response_format": "webm"})


def test_a_failure_for_the_log_names_its_type_even_when_its_text_is_empty() -> None:
    assert brief(TimeoutError()) == "TimeoutError"  # httpx's timeouts say nothing either
    assert brief(OSError("refused\nmore")) == "OSError: refused"
    long = brief(ValueError("x" * 500))
    assert (len(long), long[-1]) == (200, "…")


def test_pcm_and_wav_at_the_rates_pipelines_and_phones_run_at() -> None:
    pcm, wav = formats.FORMATS["pcm"], formats.FORMATS["wav"]
    assert formats.PCM_RATES == (8_000, 16_000, 22_050, 24_000, 44_100, 48_000)
    assert pcm.at(None) is pcm
    assert pcm.at(24_000) is pcm  # its own rate: itself
    narrow = pcm.at(16_000)
    assert (narrow.name, narrow.codec_rate) == ("pcm", 16_000)
    assert narrow.mime == "audio/pcm;rate=16000;channels=1;encoding=s16le"
    assert (wav.at(8_000).codec_rate, wav.at(8_000).mime) == (8_000, "audio/wav")
    with pytest.raises(formats.UnknownFormat, match="sample_rate 11025 is not offered for pcm"):
        pcm.at(11_025)
    # the telephone's G.711 is 8 kHz only; a compressed format its codec's rate only
    ulaw = formats.FORMATS["ulaw_8000"]
    assert (ulaw.codec, ulaw.codec_rate, ulaw.mime) == ("pcm_mulaw", 8_000, "audio/basic")
    assert ulaw.at(8_000) is ulaw
    with pytest.raises(formats.UnknownFormat, match="not offered for alaw_8000; use 8000"):
        formats.FORMATS["alaw_8000"].at(16_000)
    with pytest.raises(formats.UnknownFormat, match="not offered for mp3; use 24000"):
        formats.FORMATS["mp3"].at(48_000)


def test_the_request_params_take_a_sample_rate() -> None:
    speak = parse(SpeakParams, {"format": "pcm", "sample_rate": 16_000})
    assert speak.audio_format == formats.FORMATS["pcm"].at(16_000)
    assert parse(SpeakParams, {"format": "pcm", "sample_rate": "8000"}).audio_format.codec_rate == (
        8_000  # a query parameter's string
    )
    assert parse(SpeakParams, {"format": "ulaw_8000"}).audio_format is formats.FORMATS["ulaw_8000"]
    for bad, says in [
        ({"format": "mp3", "sample_rate": 16_000}, "sample_rate 16000 is not offered for mp3"),
        ({"format": "pcm", "sample_rate": 12_345}, "not offered for pcm; use 8000, 16000"),
        ({"format": "pcm", "sample_rate": True}, "not true or false"),
    ]:
        with pytest.raises(ServiceError, match=says) as caught:
            parse(SpeakParams, bad)
        assert caught.value.code == "invalid_field"
    openai = parse(
        OpenAISpeechParams, {"input": "Hi.", "response_format": "wav", "sample_rate": 22_050}
    )
    assert openai.audio_format == formats.FORMATS["wav"].at(22_050)
    telephone = parse(OpenAISpeechParams, {"input": "Hi.", "response_format": "alaw_8000"})
    assert telephone.audio_format is formats.FORMATS["alaw_8000"]
    with pytest.raises(ServiceError, match="not offered for ogg"):
        parse(OpenAISpeechParams, {"input": "Hi.", "response_format": "opus", "sample_rate": 8000})
