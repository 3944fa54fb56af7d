"""What every c4 producer of Kafka records shares, whichever layer it lives in.

The producer settings that make records land and stay where the contract says (idempotent,
so no duplicates per partition; murmur2, so a key lands where Faust and the Java clients
put it; lz4), a message's record (topic, key, value), and the wait when librdkafka's queue
is full. Nothing here imports a Kafka client: the node agent's publisher and the action
workers' outbox hand in their own ``Producer``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from schemas.base import C4Model
from schemas.codec import encode, key_of
from schemas.topics import TopicNames

# Merged into every c4 producer's client configuration (what the contract relies on).
PRODUCER_SETTINGS: dict[str, Any] = {
    "enable.idempotence": True,
    "compression.type": "lz4",
    "partitioner": "murmur2_random",
}
QUEUE_FULL_WAIT_S = 0.1


def record_of(
    message: C4Model, names: TopicNames, key: str | None = None
) -> tuple[str, bytes, bytes]:
    """(topic, key, value) of a message: its kind's topic here, the contract's key (or
    ``key``) and its JSON."""
    topic = names.of_kind(str(getattr(message, "kind", "")))
    return topic, (key if key is not None else key_of(message)).encode(), encode(message)


def produce_waiting(
    producer: Any,  # confluent_kafka.Producer (not imported: this layer has no client)
    topic: str,
    value: bytes,
    key: bytes,
    on_delivery: Callable[..., None],
) -> None:
    """Queue one record, serving delivery reports while librdkafka's queue is full."""
    while True:
        try:
            producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
            break
        except BufferError:
            producer.poll(QUEUE_FULL_WAIT_S)
    producer.poll(0)
