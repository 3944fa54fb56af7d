"""Kafka SASL/PLAIN and Redis AUTH on a private stack: every client connects with the right
credentials, fails in one clear line with wrong ones, and no secret ever shows.

One broker (its client listener SASL_PLAINTEXT, PLAIN, one user) and one Redis
(``requirepass``) serve the whole module. The clients: the Publisher and a confluent
consumer, ``c4 doctor``, ``c4 topics create``, the streams worker (Faust/aiokafka, given
``broker_credentials``) and the action worker (confluent + redis-py). Every stdout, stderr,
log file and error message of those runs is searched for the secrets.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import redis
from confluent_kafka import Consumer, Producer
from pydantic import SecretStr

from actions.state.store import RedisState
from c4.security import KafkaAccessError, check_kafka_access, redacted
from c4.settings import Settings
from producers.publisher import Publisher
from schemas.codec import decode
from schemas.messages import Action, Deadletter, Link
from tests.contract import contract_examples
from tests.integration.private_stack import PrivateStack
from tests.integration.workers import REPO

pytestmark = pytest.mark.integration

USER = "c4user"
# Unique, greppable secrets; the Kafka one has what escaping must survive (quote, backslash,
# '=', spaces, non-ASCII).
KAFKA_SECRET = f'k-{uuid.uuid4().hex[:12]} "q"\\=é'
REDIS_SECRET = f"r-{uuid.uuid4().hex[:12]}"
WRONG_SECRET = f"w-{uuid.uuid4().hex[:12]}"
SECRETS = (KAFKA_SECRET, REDIS_SECRET, WRONG_SECRET)


@pytest.fixture(scope="module")
def secure() -> Iterator[PrivateStack]:
    with PrivateStack(
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="PLAIN",
        kafka_sasl_username=USER,
        kafka_sasl_password=SecretStr(KAFKA_SECRET),
        redis_password=SecretStr(REDIS_SECRET),
    ) as stack:
        yield stack


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"a secret was shown: {text[-2000:]}"
            # Neither its distinctive part alone (an escaped or truncated rendering).
            assert secret[:14] not in text, f"part of a secret was shown: {text[-2000:]}"


def c4_env(stack: PrivateStack, prefix: str, **overrides: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("C4_")}
    env |= {
        "PYTHONPATH": str(REPO),
        "C4_KAFKA_BOOTSTRAP": stack.bootstrap,
        "C4_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "C4_KAFKA_SASL_MECHANISM": "PLAIN",
        "C4_KAFKA_SASL_USERNAME": USER,
        "C4_KAFKA_SASL_PASSWORD": KAFKA_SECRET,
        "C4_REDIS_URL": stack.redis_url,
        "C4_REDIS_PASSWORD": REDIS_SECRET,
        "C4_REDIS_KEY_PREFIX": f"sec:{prefix}",
        "C4_TOPIC_PREFIX": f"sec.{prefix}.",
        "C4_TOPIC_PARTITIONS": "2",
        "C4_STACK_DIR": str(stack.settings.stack_dir),
    }
    return env | overrides


def c4(env: dict[str, str], *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "c4.cli", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("c4: error: "), result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def client_config(stack: PrivateStack) -> dict[str, object]:
    return {**stack.settings.kafka_client_config(), "log_level": 3}


def read_topic(stack: PrivateStack, topic: str, count: int, timeout_s: float = 60) -> list[bytes]:
    consumer = Consumer(
        {
            **client_config(stack),
            "group.id": f"check-{uuid.uuid4().hex[:8]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) < count and time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is not None and record.error() is None:
                values.append(record.value() or b"")
    finally:
        consumer.close()
    return values


# --- the stack itself --------------------------------------------------------------------


def test_secrets_are_in_no_command_line_and_the_broker_file_is_private(
    secure: PrivateStack,
) -> None:
    for component in ("kafka", "redis"):
        command = (
            Path(f"/proc/{secure.pid(component)}/cmdline").read_bytes().decode(errors="replace")
        )
        assert_no_secret(command)
    properties = secure.run_dir("kafka") / "server.properties"
    assert properties.stat().st_mode & 0o077 == 0
    assert (secure.run_dir("redis") / "auth.conf").stat().st_mode & 0o077 == 0


def test_a_client_without_credentials_is_refused(secure: PrivateStack) -> None:
    plain = Settings(kafka_bootstrap=secure.bootstrap)
    with pytest.raises(KafkaAccessError, match="does not answer.*expect SASL or TLS"):
        check_kafka_access(plain, timeout_s=3)
    client = redis.Redis.from_url(secure.redis_url, socket_timeout=5)
    try:
        with pytest.raises(redis.AuthenticationError):
            client.ping()
    finally:
        client.close()


# --- the Python clients ------------------------------------------------------------------


def test_publisher_and_consumer_with_the_credentials(secure: PrivateStack, unique: str) -> None:
    settings = secure.settings.model_copy(update={"topic_prefix": f"sec.{unique}."})
    assert check_kafka_access(settings) == 1
    publisher = Publisher(settings.kafka_client_config(), settings.topic_prefix)
    link = Link.model_validate(contract_examples()["link"])
    publisher.publish(link)
    publisher.flush(30)
    assert publisher.counts.delivered == 1 and publisher.counts.failed == 0
    (value,) = read_topic(secure, f"sec.{unique}.c4.link.v1", 1)
    assert decode(value, "link") == link


def test_wrong_kafka_password_is_one_clear_error(secure: PrivateStack) -> None:
    wrong = secure.settings.model_copy(update={"kafka_sasl_password": SecretStr(WRONG_SECRET)})
    began = time.monotonic()
    with pytest.raises(KafkaAccessError) as raised:
        check_kafka_access(wrong, timeout_s=30)
    message = str(raised.value)
    assert f"rejects the credentials of user {USER} (PLAIN)" in message
    assert "\n" not in message
    # Told at once, not after the timeout.
    assert time.monotonic() - began < 25
    assert_no_secret(message, repr(raised.value), repr(wrong))


def test_redis_state_with_and_without_the_password(secure: PrivateStack, unique: str) -> None:
    state = RedisState.connect(secure.redis_url, REDIS_SECRET, f"sec:{unique}")
    try:
        assert state.client.ping()
    finally:
        state.close()
    wrong = RedisState.connect(secure.redis_url, WRONG_SECRET, f"sec:{unique}")
    try:
        with pytest.raises(redis.AuthenticationError) as raised:
            wrong.client.ping()
        assert_no_secret(str(raised.value))
    finally:
        wrong.close()
    url = secure.redis_url.replace("redis://", f"redis://:{WRONG_SECRET}@")
    assert WRONG_SECRET not in redacted(url) and "***" in redacted(url)


# --- the commands ------------------------------------------------------------------------


def test_doctor_and_topics_with_the_credentials(secure: PrivateStack, unique: str) -> None:
    env = c4_env(secure, unique)
    created = c4(env, "topics", "create")
    assert created.returncode == 0, created.stderr
    result = c4(env, "doctor")
    assert result.returncode == 0, result.stderr
    assert f"kafka {secure.bootstrap}: 1 broker(s)" in result.stdout
    assert "redis redis://127.0.0.1" in result.stdout
    assert "detection core: " in result.stdout  # compiled, or pure and why
    assert_no_secret(created.stdout, created.stderr, result.stdout, result.stderr)


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("C4_KAFKA_SASL_PASSWORD", f"rejects the credentials of user {USER} (PLAIN)"),
        ("C4_REDIS_PASSWORD", "invalid username-password pair"),
    ],
    ids=["kafka", "redis"],
)
def test_wrong_password_is_one_line_from_every_command(
    secure: PrivateStack, unique: str, setting: str, expected: str
) -> None:
    env = c4_env(secure, unique, **{setting: WRONG_SECRET})
    commands = [("doctor",), ("actions", "worker", "--metrics-port", "0")]
    if setting.startswith("C4_KAFKA"):
        commands.append(("streams", "worker", "--metrics-port", "0", "--web-port", "0"))
    for command in commands:
        result = c4(env, *command)
        assert result.returncode in (1, 2), (command, result.stderr)
        assert expected in one_error_line(result), (command, result.stderr)
        assert_no_secret(result.stdout, result.stderr)
    # A password in the Redis URL is not shown either.
    url = secure.redis_url.replace("redis://", f"redis://:{WRONG_SECRET}@")
    result = c4(c4_env(secure, unique, C4_REDIS_URL=url, C4_REDIS_PASSWORD=""), "doctor")
    assert result.returncode == 1 and "***" in one_error_line(result)
    assert_no_secret(result.stdout, result.stderr)


def run_worker(env: dict[str, str], log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "c4.cli", *args],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_worker(process: subprocess.Popen[bytes], log: Path) -> str:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
    return log.read_text(errors="replace")


def test_streams_worker_consumes_and_produces_over_sasl(
    secure: PrivateStack, unique: str, tmp_path: Path
) -> None:
    env = c4_env(secure, unique)
    assert c4(env, "topics", "create").returncode == 0
    log = tmp_path / "streams.log"
    worker = run_worker(
        env,
        log,
        "streams",
        "worker",
        "--app-id",
        f"sec-{unique}",
        "--web-port",
        str(free_port()),
        "--metrics-port",
        "0",
        "--loglevel",
        "debug",
    )
    try:
        producer = Producer({**client_config(secure), "partitioner": "murmur2_random"})
        good = contract_examples()["collective"]
        producer.produce(f"sec.{unique}.c4.collective.v1", key=b"job-7", value=b"{not json")
        producer.produce(f"sec.{unique}.c4.collective.v1", key=b"job-7", value=orjson.dumps(good))
        assert producer.flush(30) == 0
        letters = read_topic(secure, f"sec.{unique}.c4.deadletter.v1", 1, timeout_s=90)
        assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        output = stop_worker(worker, log)
    assert len(letters) == 1, output[-3000:]
    letter = decode(letters[0], "deadletter")
    assert isinstance(letter, Deadletter) and "invalid JSON" in letter.error
    assert_no_secret(output)


def faust_a_worker(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """Faust's own command line on c4's app (``faust -A c4.faust_app worker``)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "faust", "-A", "c4.faust_app", "worker", "-l", "debug"]
            + ["--without-web"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def test_faust_a_worker_uses_the_credentials_and_refuses_wrong_ones(
    secure: PrivateStack, unique: str, tmp_path: Path
) -> None:
    """The `faust -A` path builds the worker as `c4 streams worker` does: SASL applied."""
    env = c4_env(secure, unique, C4_STREAMS_APP_ID=f"sec-fa-{unique}", C4_STREAMS_METRICS_PORT="0")
    assert c4(env, "topics", "create").returncode == 0
    log = tmp_path / "faust.log"
    worker = faust_a_worker(env, log)
    try:
        producer = Producer({**client_config(secure), "partitioner": "murmur2_random"})
        producer.produce(f"sec.{unique}.c4.collective.v1", key=b"job-8", value=b"{not json")
        assert producer.flush(30) == 0
        letters = read_topic(secure, f"sec.{unique}.c4.deadletter.v1", 1, timeout_s=90)
        assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        output = stop_worker(worker, log)
    assert len(letters) == 1, output[-3000:]
    assert_no_secret(output)

    wrong = faust_a_worker(c4_env(secure, unique, C4_KAFKA_SASL_PASSWORD=WRONG_SECRET), log)
    try:
        wrong.wait(60)
    finally:
        output = stop_worker(wrong, log)
    assert wrong.returncode in (1, 2), output[-3000:]
    lines = [line for line in output.splitlines() if line.startswith("c4 faust app: ")]
    assert len(lines) == 1 and f"rejects the credentials of user {USER}" in lines[0], output
    assert_no_secret(output)


def test_actions_worker_acts_over_sasl_and_redis_auth(
    secure: PrivateStack, unique: str, tmp_path: Path
) -> None:
    env = c4_env(secure, unique)
    assert c4(env, "topics", "create").returncode == 0
    log = tmp_path / "actions.log"
    worker = run_worker(
        env,
        log,
        "actions",
        "worker",
        "--group",
        f"sec-{unique}",
        "--dry-run",
        "--metrics-port",
        "0",
        "--loglevel",
        "debug",
    )
    try:
        diagnosis = dict(contract_examples()["diagnosis"], id=f"d-{unique}")
        producer = Producer({**client_config(secure), "partitioner": "murmur2_random"})
        producer.produce(
            f"sec.{unique}.c4.diagnosis.v1", key=b"job-7", value=orjson.dumps(diagnosis)
        )
        assert producer.flush(30) == 0
        records = read_topic(secure, f"sec.{unique}.c4.action.v1", 1, timeout_s=90)
        assert worker.poll() is None, log.read_text(errors="replace")[-3000:]
    finally:
        output = stop_worker(worker, log)
    assert records, output[-3000:]
    action = decode(records[0], "action")
    assert isinstance(action, Action) and action.diagnosis == f"d-{unique}"
    assert_no_secret(output)
