"""The one module of the action workers that talks to Kafka (confluent-kafka).

The consumer never auto-commits: the worker commits a record's offset only after the
outcome is on ``c4.action.v1`` (delivery confirmed) and in Redis. The producer is
idempotent and partitions with murmur2, like every other c4 producer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer

from actions import ActionsError
from schemas.base import C4Model
from schemas.edge import PRODUCER_SETTINGS, produce_waiting, record_of
from schemas.topics import TopicNames

log = logging.getLogger("c4.actions")


class TransportUnavailable(ActionsError):  # noqa: N818 - reads as what it is
    """Kafka did not take a message in time; the caller retries, nothing was committed."""


class Outbox:
    """The producer of the worker's outputs: action records, job placements, dead letters."""

    def __init__(
        self,
        client_config: Mapping[str, Any],
        topic_prefix: str = "",
        stop: threading.Event | None = None,
    ) -> None:
        self._producer = Producer(
            {
                **client_config,
                "log_level": 3,  # errors only: outages are reported once
                **PRODUCER_SETTINGS,
                "linger.ms": 5,
            }
        )
        self._names = TopicNames(topic_prefix)
        self._stop = stop or threading.Event()
        self._failed: list[str] = []

    def topic(self, kind: str) -> str:
        """The (prefixed) topic of a message kind."""
        return self._names.of_kind(kind)

    def publish(self, message: C4Model, key: str | None = None) -> None:
        """Queue one v1 message on its topic, keyed by the contract's rule unless given."""
        topic, raw_key, value = record_of(message, self._names, key)
        produce_waiting(self._producer, topic, value, raw_key, self._report)

    def _report(self, error: KafkaError | None, record: Message) -> None:
        if error is not None:
            self._failed.append(error.str())

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued message is delivered; `TransportUnavailable` if one failed.

        While the broker is away librdkafka keeps retrying (up to ``message.timeout.ms``); this
        waits for it, and gives up on a delivery error, a stop request or ``timeout_s``.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._producer.flush(1.0) > 0:
            if self._stop.is_set() or (deadline is not None and time.monotonic() > deadline):
                message = "messages still waiting for delivery"
                raise TransportUnavailable(message)
        if self._failed:
            failures, self._failed = self._failed, []
            message = f"{len(failures)} messages not delivered (last: {failures[-1]})"
            raise TransportUnavailable(message)

    def close(self) -> None:
        """Deliver what is queued (waits at most 10 s)."""
        self._producer.flush(10.0)


class KafkaTransport:
    """A consumer of the worker's input topics, and its `Outbox`."""

    def __init__(
        self,
        client_config: Mapping[str, Any],
        group: str,
        topics: Iterable[str],
        topic_prefix: str = "",
        stop: threading.Event | None = None,
    ) -> None:
        self._consumer = Consumer(
            {
                **client_config,
                "log_level": 3,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "session.timeout.ms": 10_000,
            }
        )
        self._consumer.subscribe(list(topics))
        self.outbox = Outbox(client_config, topic_prefix, stop)

    def poll(self, timeout_s: float) -> Message | None:
        """The next record, or None (broker errors are logged, the client reconnects)."""
        record = self._consumer.poll(timeout_s)
        if record is None:
            return None
        error = record.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                log.warning("kafka consumer: %s", error.str())
            return None
        return record

    def assigned(self, topic: str) -> frozenset[int]:
        """The partitions of ``topic`` this consumer owns now (what the group assigned it)."""
        return frozenset(tp.partition for tp in self._consumer.assignment() if tp.topic == topic)

    def publish(self, message: C4Model, key: str | None = None) -> None:
        """Queue one v1 message (see `Outbox.publish`)."""
        self.outbox.publish(message, key)

    def flush(self) -> None:
        """Wait for delivery (see `Outbox.flush`)."""
        self.outbox.flush()

    def commit(self, record: Message) -> bool:
        """Commit past one record (synchronously); False when the broker refused it.

        A lost commit is harmless: the record comes again and its diagnosis is a duplicate.
        """
        try:
            self._consumer.commit(message=record, asynchronous=False)
        except KafkaException as error:
            log.warning("kafka commit failed (the record will be seen again): %s", error)
            return False
        return True

    def close(self) -> None:
        """Leave the group and deliver what is queued."""
        try:
            self._consumer.close()
        finally:
            self.outbox.close()
