"""The private stack used by outage tests: its own ports, stop and restart one component."""

from __future__ import annotations

import time

import redis
from confluent_kafka.admin import AdminClient

from tests.integration.private_stack import PrivateStack


def _topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=20).topics)


def test_private_stack_survives_a_kill_of_each_component(private_stack: PrivateStack) -> None:
    assert private_stack.settings.stack_kafka_port != 9092
    client = redis.Redis.from_url(private_stack.redis_url, socket_timeout=5)
    client.set("kept", "yes")
    client.close()
    time.sleep(1.5)  # appendfsync everysec: let the write reach the append-only file
    _topics(private_stack.bootstrap)

    private_stack.stop("redis")
    private_stack.stop("kafka")
    private_stack.start()

    client = redis.Redis.from_url(private_stack.redis_url, socket_timeout=5)
    assert client.get("kept") == b"yes"
    client.close()
    # The restarted broker answers metadata requests again (list_topics raises otherwise).
    _topics(private_stack.bootstrap)
