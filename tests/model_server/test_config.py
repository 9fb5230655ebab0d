from __future__ import annotations

from pathlib import Path

import pytest

from model_server.config import Settings, parse_settings


def test_defaults() -> None:
    s = parse_settings([], env={})
    assert s == Settings()
    assert (s.host, s.port, s.engine) == ("127.0.0.1", 8080, "onnx")


def test_env_then_flags() -> None:
    env = {
        "MODEL_SERVER_PORT": "9000",
        "MODEL_SERVER_VOICES_DIR": "/v",
        "MODEL_SERVER_WARMUP": "no",
    }
    s = parse_settings([], env=env)
    assert (s.port, s.voices_dir, s.warmup) == (9000, Path("/v"), False)
    s = parse_settings(["--port", "9100", "--workers", "3"], env=env)
    assert (s.port, s.workers) == (9100, 3)


def test_serve_defaults_listen_everywhere() -> None:
    s = parse_settings([], env={}, host="0.0.0.0", port=8080)
    assert (s.host, s.port) == ("0.0.0.0", 8080)


def test_bad_values_exit_with_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings(["--engine", "tensorrt"], env={})
    assert "invalid choice" in capsys.readouterr().err


def test_help_never_prints_a_secret(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.config import parse_settings as parse_gateway

    env = {"GATEWAY_OPENAI_API_KEY": "sk-not-for-logs-123", "GATEWAY_OPENAI_MODEL": "llama3.2"}
    assert parse_gateway([], env=env).openai_api_key == "sk-not-for-logs-123"  # still used
    with pytest.raises(SystemExit):
        parse_gateway(["--help"], env=env)
    shown = capsys.readouterr().out
    assert "sk-not-for-logs-123" not in shown
    assert "GATEWAY_OPENAI_API_KEY; default set" in " ".join(shown.split())
    assert "llama3.2" in shown  # other values still show where they came from
    assert "default 512" in shown  # max_tokens is not a secret


def test_english_voices_auto_by_default_off_by_flag_or_env() -> None:
    assert parse_settings([], env={}).english_voices == "auto"
    assert parse_settings([], env={"MODEL_SERVER_ENGLISH_VOICES": "off"}).english_voices == "off"
    assert parse_settings(["--english-voices", "off"], env={}).english_voices == "off"
    with pytest.raises(SystemExit):
        parse_settings(["--english-voices", "sometimes"], env={})
