"""The one module of the producers that talks to Kafka: publish v1 messages by the registry.

Idempotent (acks=all, ordered retries, no duplicates per partition), lz4-compressed,
batched, keyed by the contract's key rule and partitioned with murmur2 so keys land where
Faust and the Java clients expect them.

With a spool, nothing is lost while the broker is away: when every broker connection is
down, or queued messages stop being acknowledged for ``stall_s``, new messages go to the
bounded disk spool; what librdkafka already holds stays there (it never times out) and is
delivered first when the broker is back. While it is away, the oldest spooled record waits
in librdkafka as a probe (nothing blocks the caller); its acknowledgement ends the outage,
and the spool is replayed oldest first, new messages queueing behind it, so each partition
keeps the order the messages were published in.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from producers import ProducerError
from producers.spool import DiskSpool, Record
from schemas.base import C4Model
from schemas.codec import encode, key_of
from schemas.edge import PRODUCER_SETTINGS, produce_waiting
from schemas.messages import Collective, Collectives
from schemas.topics import TopicNames

NS_PER_S = 1_000_000_000


class PublishError(ProducerError):
    """Messages could not be delivered to Kafka."""


@dataclass(slots=True)
class DeliveryCounts:
    """Delivery reports received so far, and what the spool did."""

    delivered: int = 0
    failed: int = 0
    last_error: str | None = None
    outages: int = 0
    spooled: int = 0
    replayed: int = 0
    dropped_heartbeats: int = 0
    dropped_records: int = 0


_PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


def is_heartbeat(message: C4Model) -> bool:
    """A collective message with empty ops (or a batch of only such): the first thing to
    drop when the spool is full."""
    if isinstance(message, Collectives):
        return all(len(each.ops) == 0 for each in message.messages)
    return isinstance(message, Collective) and len(message.ops) == 0


class Publisher:
    """Publishes v1 messages to their topics (names optionally prefixed)."""

    def __init__(
        self,
        client_config: Mapping[str, Any],
        topic_prefix: str = "",
        spool: DiskSpool | None = None,
        stall_s: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        config = {
            **client_config,
            **PRODUCER_SETTINGS,
            "linger.ms": 20,
            "batch.num.messages": 10_000,
        }
        if spool is not None:
            # What librdkafka holds is never timed out: it is delivered, in order, first.
            config |= {"message.timeout.ms": 0, "error_cb": self._client_error}
        self._producer = Producer(config)
        self._names = TopicNames(topic_prefix)
        self._spool = spool
        self._stall_s = stall_s
        self._monotonic = monotonic
        self._down = False
        self._down_at = 0.0
        self._progress_at = monotonic()  # last produce into an empty queue, or last ack
        self._acked_at = 0.0
        self._purged: list[Record] | None = None  # collects what close() takes back
        self._on_delivery = {
            flag: functools.partial(self._delivered, flag) for flag in (False, True)
        }
        self.counts = DeliveryCounts()

    @property
    def down(self) -> bool:
        """True while the broker is taken as unreachable (messages go to the spool)."""
        return self._down

    def topic_of(self, message: C4Model) -> str:
        """The topic a message goes to."""
        kind = str(getattr(message, "kind", ""))
        try:
            return self._names.of_kind(kind)
        except KeyError:
            error = f"kind {kind!r} has no topic"
            raise PublishError(error) from None

    def publish(self, message: C4Model) -> None:
        """Queue one message (to librdkafka, or to the spool while the broker is away)."""
        record = Record(
            self.topic_of(message), key_of(message).encode(), encode(message), is_heartbeat(message)
        )
        if self._spool is not None:
            self.service()
            if self._down or len(self._spool):
                self._spool.append(record)
                self._sync_spool_counts()
                self.service()
                return
        self._produce(record)

    def _produce(self, record: Record) -> None:
        if len(self._producer) == 0:
            self._progress_at = self._monotonic()
        # The heartbeat flag rides with the delivery report (librdkafka holds the bytes):
        # a record purged by close() goes back to the spool flagged as it was queued.
        on_delivery = self._on_delivery[record.heartbeat]
        produce_waiting(self._producer, record.topic, record.value, record.key, on_delivery)

    def service(self) -> None:
        """Serve delivery reports; notice an outage or its end; replay the spool when up."""
        self._producer.poll(0)
        if self._spool is None:
            return
        now = self._monotonic()
        if not self._down and len(self._producer) and now - self._progress_at > self._stall_s:
            self._go_down(f"no acknowledgement for {now - self._progress_at:.1f} s")
        if self._down:
            if self._acked_at > self._down_at:
                self._down = False  # the broker acknowledged something since the outage began
                self._progress_at = now
            elif len(self._producer) == 0 and len(self._spool):
                # The oldest spooled record waits in librdkafka as the probe: its delivery
                # says the broker is back, and it is next in order anyway.
                self._produce(self._spool.take(1)[0])
                self.counts.replayed += 1
        if not self._down:
            self._replay()

    def _replay(self, window: int = 20_000, batch: int = 1_000) -> None:
        assert self._spool is not None  # noqa: S101 -- only called with a spool
        while len(self._spool) and len(self._producer) < window:
            records = self._spool.take(batch)
            for record in records:
                self._produce(record)
            self.counts.replayed += len(records)

    def _go_down(self, reason: str) -> None:
        if not self._down:
            self._down = True
            self._down_at = self._monotonic()
            self.counts.outages += 1
            self.counts.last_error = reason

    def _client_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            self._go_down(str(error))

    def _sync_spool_counts(self) -> None:
        assert self._spool is not None  # noqa: S101 -- only called with a spool
        self.counts.spooled = self._spool.counts.spooled
        self.counts.dropped_heartbeats = self._spool.counts.dropped_heartbeats
        self.counts.dropped_records = self._spool.counts.dropped_records

    def _delivered(self, heartbeat: bool, error: KafkaError | None, record: Message) -> None:
        if error is not None and self._purged is not None and error.code() in _PURGED:
            topic, key, value = record.topic(), record.key(), record.value()
            if topic is not None and value is not None:
                self._purged.append(Record(topic, key or b"", value, heartbeat))
            return
        if error is None:
            self.counts.delivered += 1
            self._progress_at = self._acked_at = self._monotonic()
        else:
            self.counts.failed += 1
            self.counts.last_error = str(error)

    def in_flight(self) -> int:
        """Messages handed to librdkafka and not yet acknowledged (spooled ones are on disk)."""
        return len(self._producer)

    def pending(self) -> int:
        """Messages not yet acknowledged: in librdkafka plus in the spool."""
        return len(self._producer) + (len(self._spool) if self._spool is not None else 0)

    def drain(self, timeout_s: float, sleep: Callable[[float], None] = time.sleep) -> int:
        """Serve until everything is acknowledged or ``timeout_s`` passes; what is left."""
        deadline = self._monotonic() + timeout_s
        while self.pending() and self._monotonic() < deadline:
            self.service()
            self._producer.poll(0.05)
            if self._down:
                sleep(0.05)
        return self.pending()

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait for every queued message; a PublishError when some were not delivered."""
        left = self.drain(timeout_s) if self._spool is not None else 0
        left += self._producer.flush(timeout_s if self._spool is None else 0.0)
        if left or self.counts.failed:
            error = (
                f"{left} messages not delivered in {timeout_s} s, {self.counts.failed} failed"
                f" (last error: {self.counts.last_error})"
            )
            raise PublishError(error)

    def close(self, timeout_s: float = 10.0) -> int:
        """Deliver what can be delivered in ``timeout_s``; what is left stays in the spool,
        in order, for the next start (even what librdkafka held: it is purged and put back)."""
        if self._spool is None:
            return int(self._producer.flush(timeout_s))
        left = self.drain(timeout_s)
        if len(self._producer):
            self._purged = []
            self._producer.purge(in_queue=True, in_flight=True)
            self._producer.flush(5.0)  # serves the purged messages' delivery reports
            self._spool.prepend(self._purged)
            self._purged = None
        self._spool.close()
        return int(left)


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
