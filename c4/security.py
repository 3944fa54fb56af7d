"""Kafka and Redis security settings as each client takes them; clear errors; no secret shown.

confluent-kafka (producers, the action worker, ``c4 doctor``) takes librdkafka keys from
`Settings.kafka_client_config`; Faust (aiokafka) takes ``broker_credentials``, built here
from the same settings; Redis takes the password and, for ``rediss://`` URLs, TLS options.
`check_kafka_access` tells a wrong password from a broker that is down, in one line, before a
worker starts; `redacted` takes the password out of a URL before it is printed.
"""

from __future__ import annotations

import logging
import ssl
import time
import urllib.parse
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from c4 import C4Error

if TYPE_CHECKING:
    from c4.settings import Settings

log = logging.getLogger("c4.security")


class KafkaAccessError(C4Error):
    """The configured Kafka cannot be used: wrong credentials, wrong protocol, or no answer."""

    exit_code = 2


def redacted(url: str) -> str:
    """``url`` with the password of its user part replaced by ``***`` (for messages, logs)."""
    try:
        parts = urllib.parse.urlsplit(url)
        if parts.password is None:
            return url
        host = parts.netloc.rpartition("@")[2]
        user = parts.username or ""
        return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return "<unparsable URL>"


def ssl_context(settings: Settings) -> ssl.SSLContext:
    """A client TLS context that verifies the broker against C4_KAFKA_SSL_CA_LOCATION (or the
    system's CAs when unset)."""
    location = settings.kafka_ssl_ca_location
    return ssl.create_default_context(cafile=str(location) if location is not None else None)


def faust_credentials(settings: Settings) -> Any:
    """Faust's ``broker_credentials`` for the settings' protocol (None for PLAINTEXT)."""
    # Imported here: Faust is heavy and only the streams worker needs it.
    import faust

    protocol = settings.kafka_security_protocol
    if protocol == "PLAINTEXT":
        return None
    if protocol == "SSL":
        return faust.SSLCredentials(ssl_context(settings))
    password = settings.kafka_sasl_password
    return faust.SASLCredentials(
        username=settings.kafka_sasl_username,
        password=password.get_secret_value() if password is not None else None,
        mechanism=settings.kafka_sasl_mechanism or "PLAIN",
        ssl_context=ssl_context(settings) if protocol == "SASL_SSL" else None,
    )


class _Collected(logging.Handler):
    """Keeps librdkafka's log lines instead of printing every failed attempt on stderr."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _collecting_logger() -> tuple[logging.Logger, _Collected]:
    logger = logging.getLogger(f"c4.security.librdkafka.{uuid.uuid4().hex[:8]}")
    collected = _Collected()
    logger.addHandler(collected)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger, collected


def check_kafka_access(
    settings: Settings, timeout_s: float = 15.0, require_answer: bool = True
) -> int | None:
    """The broker count, once the configured Kafka answers with these credentials.

    `KafkaAccessError` in one line: credentials rejected or TLS failed (at once, not after
    the timeout); with ``require_answer``, also no answer within ``timeout_s`` (a broker that
    closes the connection is named: it expects SASL or TLS). Without it, a broker that is
    only away gives a warning and None: workers start and wait for it, as after an outage.
    """
    # Imported here: every c4 command imports this module, few talk to Kafka (35 ms).
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    errors: list[KafkaError] = []
    logger, logged = _collecting_logger()
    config = {**settings.kafka_client_config(), "error_cb": errors.append, "logger": logger}
    admin = AdminClient(config)
    where = f"kafka at {settings.kafka_bootstrap}"
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return len(admin.list_topics(timeout=1.0).brokers)
        except KafkaException:
            admin.poll(0)
        for error in errors:
            if error.code() == KafkaError._AUTHENTICATION:
                detail = error.str().partition("SASL authentication error: ")[2] or error.str()
                user = settings.kafka_sasl_username or "(none)"
                message = (
                    f"{where} rejects the credentials of user {user}"
                    f" ({settings.kafka_sasl_mechanism or 'no SASL mechanism'}): {detail}"
                )
                raise KafkaAccessError(message)
            if error.code() == KafkaError._SSL:
                message = f"{where}: TLS failed: {error.str()}"
                raise KafkaAccessError(message)
        if time.monotonic() >= deadline:
            last = errors[-1].str() if errors else "no answer"
            if not require_answer:
                log.warning("%s does not answer yet (%s); going on", where, last)
                return None
            hint = (
                " (it closes the connection: does it expect SASL or TLS?"
                " C4_KAFKA_SECURITY_PROTOCOL is PLAINTEXT)"
                if settings.kafka_security_protocol == "PLAINTEXT"
                and any("closed by peer" in line for line in logged.lines)
                else ""
            )
            message = f"{where} does not answer within {timeout_s:.0f} s: {last}{hint}"
            raise KafkaAccessError(message)


def _renderings(secret: str) -> set[str]:
    """How a secret can appear in a log line: as is, or escaped inside a str or bytes repr."""
    forms = {secret, repr(secret)[1:-1], repr(secret.encode("utf-8", "surrogatepass"))[2:-1]}
    forms |= {form.replace("'", "\\'") for form in forms} | {
        form.replace('"', '\\"') for form in forms
    }
    return {form for form in forms if len(form) >= 4}


# aiokafka logs every request at DEBUG, SASL's included: its bytes hold "user\0password".
_NEVER_LOGGED = ("SaslAuthenticateRequest",)


def install_secret_redaction(secrets: Iterable[str | None]) -> None:
    """From now on, every log record of this process has these secrets replaced by ``***``.

    A record factory, so it applies to every logger and handler (Faust's, aiokafka's, ours)
    whenever they were configured; it formats only records that are emitted anyway.
    """
    forms = sorted({form for secret in secrets if secret for form in _renderings(secret)}, key=len)[
        ::-1
    ]
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is logging's to report
            return record
        hidden = text
        if any(marker in text for marker in _NEVER_LOGGED):
            hidden = f"{text[:60]}... (a SASL request: not logged)"
        for form in forms:
            hidden = hidden.replace(form, "***")
        if hidden != text:
            record.msg, record.args = hidden, None
        return record

    logging.setLogRecordFactory(factory)


def settings_secrets(settings: Settings) -> list[str | None]:
    """The secret values in the settings: SASL and Redis passwords, a password in the URL."""
    secrets = [
        settings.kafka_sasl_password.get_secret_value() if settings.kafka_sasl_password else None,
        settings.redis_password.get_secret_value() if settings.redis_password else None,
    ]
    try:
        secrets.append(urllib.parse.urlsplit(settings.redis_url).password)
    except ValueError:
        pass
    return secrets
