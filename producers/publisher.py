"""The one module of the producers that talks to Kafka: publish v1 messages by the registry.

Idempotent (acks=all, ordered retries, no duplicates per partition), lz4-compressed,
batched, keyed by the contract's key rule and partitioned with murmur2 so keys land where
Faust and the Java clients expect them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from producers import ProducerError
from schemas.base import C4Model
from schemas.codec import encode, key_of
from schemas.topics import TOPICS_BY_KIND

NS_PER_S = 1_000_000_000


class PublishError(ProducerError):
    """Messages could not be delivered to Kafka."""


@dataclass(slots=True)
class DeliveryCounts:
    """Delivery reports received so far."""

    delivered: int = 0
    failed: int = 0
    last_error: str | None = None


class Publisher:
    """Publishes v1 messages to their topics (names optionally prefixed)."""

    def __init__(self, client_config: Mapping[str, Any], topic_prefix: str = "") -> None:
        self._producer = Producer(
            {
                **client_config,
                "enable.idempotence": True,
                "compression.type": "lz4",
                "linger.ms": 20,
                "batch.num.messages": 10_000,
                "partitioner": "murmur2_random",
            }
        )
        self._prefix = topic_prefix
        self.counts = DeliveryCounts()

    def topic_of(self, message: C4Model) -> str:
        """The topic a message goes to."""
        kind = str(getattr(message, "kind", ""))
        topic = TOPICS_BY_KIND.get(kind)
        if topic is None:
            error = f"kind {kind!r} has no topic"
            raise PublishError(error)
        return self._prefix + topic.name

    def publish(self, message: C4Model) -> None:
        """Queue one message; waits for room while librdkafka's queue is full."""
        topic, key, value = self.topic_of(message), key_of(message).encode(), encode(message)
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._delivered)
                break
            except BufferError:
                self._producer.poll(0.1)
        self._producer.poll(0)

    def _delivered(self, error: KafkaError | None, record: Message) -> None:
        if error is None:
            self.counts.delivered += 1
        else:
            self.counts.failed += 1
            self.counts.last_error = str(error)

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait for every queued message; a PublishError when some were not delivered."""
        left = self._producer.flush(timeout_s)
        if left or self.counts.failed:
            error = (
                f"{left} messages not delivered in {timeout_s} s, {self.counts.failed} failed"
                f" (last error: {self.counts.last_error})"
            )
            raise PublishError(error)


def paced(
    messages: Iterable[C4Model],
    speed: float,
    monotonic: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[C4Model]:
    """The messages, each released when its event time comes (``speed`` x real time)."""
    started: float | None = None
    first_ns = 0
    for message in messages:
        ts_ns = int(getattr(message, "ts_ns", 0))
        if started is None:
            started, first_ns = monotonic(), ts_ns
        due = started + (ts_ns - first_ns) / NS_PER_S / speed
        wait = due - monotonic()
        if wait > 0:
            sleep(wait)
        yield message
