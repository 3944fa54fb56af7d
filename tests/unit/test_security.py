"""Security settings without services: the SASL broker's properties, Faust's credentials,
URL redaction and the log redaction of secrets."""

from __future__ import annotations

import logging
from pathlib import Path

import faust
import pytest
from pydantic import SecretStr

from c4.security import (
    faust_credentials,
    install_secret_redaction,
    redacted,
    settings_secrets,
)
from c4.settings import Settings
from c4.stack import StackError, render_server_properties

SECRET = 'pa\\ss "wörd" 𝄞=1'  # noqa: S105 - a test value, with what escaping must survive


def sasl_settings(**changes: object) -> Settings:
    values: dict[str, object] = {
        "kafka_security_protocol": "SASL_PLAINTEXT",
        "kafka_sasl_mechanism": "PLAIN",
        "kafka_sasl_username": "c4user",
        "kafka_sasl_password": SecretStr(SECRET),
    }
    return Settings(**(values | changes))  # type: ignore[arg-type]


def java_properties(text: str) -> dict[str, str]:
    """What java.util.Properties reads from these lines (the escapes this file uses)."""
    entries = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        entries[key] = (
            value.encode("ascii")
            .decode("unicode_escape")
            .encode("utf-16", "surrogatepass")
            .decode("utf-16")
        )
    return entries


def test_sasl_stack_has_one_sasl_listener_whose_user_is_the_configured_one(tmp_path: Path) -> None:
    entries = java_properties(render_server_properties(sasl_settings(), tmp_path))
    assert entries["listeners"].startswith("SASL_PLAINTEXT://127.0.0.1:9092,CONTROLLER://")
    assert entries["inter.broker.listener.name"] == "SASL_PLAINTEXT"
    assert entries["sasl.enabled.mechanisms"] == "PLAIN"
    jaas = entries["listener.name.sasl_plaintext.plain.sasl.jaas.config"]
    quoted = '"' + SECRET.replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert jaas == (
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
        f' username="c4user" password={quoted} user_c4user={quoted};'
    )


def test_plaintext_stack_has_no_sasl(tmp_path: Path) -> None:
    text = render_server_properties(Settings(), tmp_path)
    assert "sasl" not in text.lower()
    assert "listeners=PLAINTEXT://127.0.0.1:9092," in text


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"kafka_security_protocol": "SASL_SSL"}, "not SASL_SSL"),
        ({"kafka_security_protocol": "SSL"}, "not SSL"),
        ({"kafka_sasl_mechanism": "SCRAM-SHA-256"}, "MECHANISM=PLAIN"),
        ({"kafka_sasl_password": None}, "PASSWORD"),
        ({"kafka_sasl_username": 'a" b'}, "USERNAME"),
    ],
)
def test_stack_refuses_what_it_cannot_serve(
    tmp_path: Path, changes: dict[str, object], message: str
) -> None:
    with pytest.raises(StackError, match=message):
        render_server_properties(sasl_settings(**changes), tmp_path)


def test_faust_gets_the_settings_credentials() -> None:
    assert faust_credentials(Settings()) is None
    credentials = faust_credentials(sasl_settings())
    assert isinstance(credentials, faust.SASLCredentials)
    assert credentials.username == "c4user" and credentials.password == SECRET
    assert credentials.mechanism.value == "PLAIN" and credentials.ssl_context is None
    assert SECRET not in repr(credentials)
    tls = faust_credentials(sasl_settings(kafka_security_protocol="SASL_SSL"))
    assert tls.protocol.value == "SASL_SSL" and tls.ssl_context is not None
    assert isinstance(
        faust_credentials(Settings(kafka_security_protocol="SSL")), faust.SSLCredentials
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:s3cret@host:6379/0", "redis://:***@host:6379/0"),
        ("rediss://user:s3cret@host/1", "rediss://user:***@host/1"),
        ("redis://host:6379/0", "redis://host:6379/0"),
        ("redis://[::1", "<unparsable URL>"),
    ],
)
def test_urls_are_shown_without_their_password(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_log_records_never_carry_a_secret(caplog: pytest.LogCaptureFixture) -> None:
    previous = logging.getLogRecordFactory()
    settings = sasl_settings(
        redis_password=SecretStr("redis-pw-1"), redis_url="redis://:url-pw-22@h:1/0"
    )
    try:
        install_secret_redaction(settings_secrets(settings))
        log = logging.getLogger("c4.test.security")
        with caplog.at_level(logging.DEBUG, logger="c4.test.security"):
            log.debug("config %s", {"sasl.password": SECRET})
            log.info("auth bytes %r", b"\x00c4user\x00" + SECRET.encode())
            log.warning("redis %s and %s", "redis-pw-1", "redis://:url-pw-22@h:1/0")
            log.debug("Request to %s: %s", "b1", "SaslAuthenticateRequest_v1(auth_bytes=...)")
        text = caplog.text
    finally:
        logging.setLogRecordFactory(previous)
    for secret in (SECRET, repr(SECRET)[1:-1], "redis-pw-1", "url-pw-22", "wörd"):
        assert secret not in text
    assert text.count("***") >= 4
    assert "a SASL request: not logged" in text
