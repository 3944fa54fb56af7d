"""Fixtures of the integration tier: the real local stack (started by scripts/test.sh)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from tests.integration.actions_harness import Cluster, HttpReceiver
from tests.integration.private_stack import PrivateStack


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """The broker the integration tests use; failing, never skipping, when it is down."""
    bootstrap = os.environ.get("C4_KAFKA_BOOTSTRAP", "127.0.0.1:9092")
    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15)
    except KafkaException as error:
        pytest.fail(f"no Kafka broker at {bootstrap} ({error}): run `c4 stack up` first")
    return bootstrap


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """The Redis the integration tests use; failing, never skipping, when it is down."""
    url = os.environ.get("C4_REDIS_URL", "redis://127.0.0.1:6379/0")
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.ping()
    except redis.RedisError as error:
        pytest.fail(f"no Redis at {url} ({error}): run `c4 stack up` first")
    finally:
        client.close()
    yield url


@pytest.fixture
def unique() -> str:
    """A fresh suffix for topic and group names, so tests never share state."""
    return uuid.uuid4().hex[:10]


@pytest.fixture
def private_stack() -> Iterator[PrivateStack]:
    """A Kafka and a Redis of this test's own, for tests that stop, kill or restart them."""
    with PrivateStack() as stack:
        yield stack


@pytest.fixture
def cluster(kafka_bootstrap: str, redis_url: str, unique: str) -> Iterator[Cluster]:
    """The actions worker's world: its own topics, Redis key prefix and configuration."""
    made = Cluster(kafka_bootstrap, redis_url, unique)
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def receiver() -> Iterator[HttpReceiver]:
    """A real HTTP receiver on 127.0.0.1 for webhooks (launcher, alerts)."""
    server = HttpReceiver()
    try:
        yield server
    finally:
        server.close()
