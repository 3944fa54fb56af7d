"""``c4 doctor``: check that the configured Kafka and Redis answer and round-trip data, and
say which detection core (compiled or pure Python) this installation runs."""

from __future__ import annotations

import argparse
import time
import uuid
from typing import TYPE_CHECKING

import redis
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from c4 import C4Error
from c4.security import KafkaAccessError, check_kafka_access, redacted
from schemas.topics import ALL_TOPICS, TopicNames
from streams.core import native

if TYPE_CHECKING:
    from c4.settings import Settings


MISSING_TOPICS = "kafka topics: missing "


class DoctorError(C4Error):
    """A component of the configured stack failed its check."""


def check_kafka(settings: Settings, timeout_s: float = 20.0) -> list[str]:
    """Broker answers, v1 topics listed, a message produced is consumed back."""
    try:
        check_kafka_access(settings, timeout_s)
    except KafkaAccessError as error:
        raise DoctorError(str(error)) from None
    # Errors only: librdkafka's retry notices while a fresh broker settles are not findings.
    config = {**settings.kafka_client_config(), "log_level": 3}
    admin = AdminClient(config)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as error:
        message = f"kafka at {settings.kafka_bootstrap} does not answer: {error}"
        raise DoctorError(message) from error
    here = TopicNames(settings.topic_prefix)
    missing = [here.of(topic) for topic in ALL_TOPICS if here.of(topic) not in metadata.topics]
    lines = [f"kafka {settings.kafka_bootstrap}: {len(metadata.brokers)} broker(s)"]
    lines.append(
        "kafka topics: all v1 topics present"
        if not missing
        else f"{MISSING_TOPICS}{', '.join(missing)} (run: c4 topics create)"
    )
    # Under the deployment's prefix: a shared broker's ACLs may allow it only its own names.
    scratch = f"{settings.topic_prefix}_c4.doctor.{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(scratch, num_partitions=1, replication_factor=1)])[
        scratch
    ].result(timeout_s)
    try:
        started = time.monotonic()
        token = uuid.uuid4().hex.encode()
        producer = Producer({**config, "enable.idempotence": True})
        producer.produce(scratch, key=b"doctor", value=token)
        if producer.flush(timeout_s) != 0:
            message = f"kafka: produce to {scratch} not delivered in {timeout_s} s"
            raise DoctorError(message)
        consumer = Consumer({**config, "group.id": scratch, "auto.offset.reset": "earliest"})
        consumer.subscribe([scratch])
        try:
            received = None
            while received is None and time.monotonic() - started < timeout_s:
                record = consumer.poll(0.5)
                if record is not None and record.error() is None:
                    received = record.value()
        finally:
            consumer.close()
        if received != token:
            message = f"kafka: message produced to {scratch} was not consumed back"
            raise DoctorError(message)
        lines.append(f"kafka round trip: {1000 * (time.monotonic() - started):.0f} ms")
    finally:
        admin.delete_topics([scratch])[scratch].result(timeout_s)
    return lines


def check_redis(settings: Settings) -> list[str]:
    """Redis answers PING and keeps a value written to it."""
    password = settings.redis_password.get_secret_value() if settings.redis_password else None
    client = redis.Redis.from_url(settings.redis_url, password=password, socket_timeout=5)
    try:
        started = time.monotonic()
        client.ping()
        key = f"{settings.redis_key_prefix}:doctor:{uuid.uuid4().hex[:8]}"
        client.set(key, b"ok", ex=60)
        if client.get(key) != b"ok":
            message = "redis: value written was not read back"
            raise DoctorError(message)
        client.delete(key)
    except redis.RedisError as error:
        message = f"redis at {redacted(settings.redis_url)} failed: {error}"
        raise DoctorError(message) from error
    finally:
        client.close()
    elapsed_ms = 1000 * (time.monotonic() - started)
    return [f"redis {redacted(settings.redis_url)}: round trip {elapsed_ms:.0f} ms"]


def missing_topics(lines: list[str]) -> bool:
    """Whether the Kafka check found v1 topics missing."""
    return any(line.startswith(MISSING_TOPICS) for line in lines)


def _run(args: argparse.Namespace, settings: Settings) -> int:
    del args
    lines = check_kafka(settings) + check_redis(settings)
    for line in lines:
        print(line)
    print(f"detection core: {native.status()}")
    if missing_topics(lines):
        # The broker answers, but no worker can start on it yet: not a healthy stack.
        message = "v1 topics missing (run: c4 topics create)"
        raise DoctorError(message)
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the ``doctor`` subcommand."""
    parser = subparsers.add_parser("doctor", help="check the configured Kafka and Redis")
    parser.set_defaults(handler=_run)
