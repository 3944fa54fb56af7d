from __future__ import annotations

import pytest
from pydantic import ValidationError

from c4.settings import Settings, load_settings


def test_env_vars_set_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("C4_KAFKA_BOOTSTRAP", "10.0.0.1:9092")
    monkeypatch.setenv("C4_TOPIC_PARTITIONS", "24")
    settings = load_settings()
    assert settings.kafka_bootstrap == "10.0.0.1:9092"
    assert settings.topic_partitions == 24


def test_explicit_arguments_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("C4_KAFKA_BOOTSTRAP", "10.0.0.1:9092")
    assert load_settings(kafka_bootstrap="127.0.0.1:1").kafka_bootstrap == "127.0.0.1:1"
    assert load_settings(kafka_bootstrap=None).kafka_bootstrap == "10.0.0.1:9092"


def test_secrets_never_shown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("C4_KAFKA_SASL_PASSWORD", "hunter2-kafka")
    monkeypatch.setenv("C4_REDIS_PASSWORD", "hunter2-redis")
    settings = Settings(kafka_sasl_mechanism="PLAIN", kafka_sasl_username="c4")
    for text in (repr(settings), str(settings), settings.model_dump_json()):
        assert "hunter2" not in text
    config = settings.kafka_client_config()
    assert config["sasl.password"] == "hunter2-kafka"
    assert config["sasl.mechanism"] == "PLAIN"


def test_bad_values_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("C4_TOPIC_PARTITIONS", "zero")
    with pytest.raises(ValidationError):
        load_settings()


def test_bad_env_gives_one_line_cli_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from c4.cli import main

    monkeypatch.setenv("C4_STACK_KAFKA_PORT", "99999")
    assert main(["validate", "-"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("c4: error: setting stack_kafka_port:")
