"""What the dashboard and the demo read from Kafka: diagnoses, actions, routes, job placements.

One consumer thread (its own group, from the earliest offset) decodes every message of the
four topics and keeps them in memory; readers take a consistent copy with `view`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, KafkaError

from c4.dashboard.model import FeedView
from schemas.codec import decode
from schemas.messages import Action, Diagnosis, Job, Route
from schemas.topics import ACTION, DIAGNOSIS, JOB, ROUTE, TopicNames

# librdkafka's own log lines (a broker restarting: a connect failure every 50 ms) would
# drown the demo's output; the feed reports its errors from the records it consumes.
CLIENT_LOG = logging.getLogger("c4.dashboard.feed.librdkafka")
CLIENT_LOG.addHandler(logging.NullHandler())
CLIENT_LOG.propagate = False

MAX_KEPT = 20_000  # per kind: a long-running dashboard keeps the newest


@dataclass(slots=True)
class _Kept:
    diagnoses: list[Diagnosis] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    rejected: int = 0


class Feed:
    """A background consumer of the diagnosis, action, route and job topics."""

    def __init__(self, client_config: dict[str, Any], topic_prefix: str, group: str) -> None:
        self._config = {
            **client_config,
            # A group of the deployment's (`DeploymentNames.dashboard_group`): never another's.
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
        names = TopicNames(topic_prefix)
        self._topics = [names.of(topic) for topic in (DIAGNOSIS, ACTION, ROUTE, JOB)]
        self._kept = _Kept()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="c4-feed", daemon=True)
        self.error: str | None = None

    def start(self) -> Feed:
        """Start consuming in the background."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the consumer and wait for its thread."""
        self._stop.set()
        self._thread.join(15)

    def view(self) -> FeedView:
        """A copy of everything seen so far."""
        with self._lock:
            kept = self._kept
            return FeedView(
                tuple(kept.diagnoses),
                tuple(kept.actions),
                tuple(kept.routes),
                tuple(kept.jobs),
                kept.rejected,
            )

    def _run(self) -> None:
        consumer = Consumer(self._config, logger=CLIENT_LOG)
        try:
            consumer.subscribe(self._topics)
            while not self._stop.is_set():
                for record in consumer.consume(500, 0.2):
                    error = record.error()
                    if error is not None:
                        if error.code() != KafkaError._PARTITION_EOF:  # noqa: SLF001
                            self.error = str(error)
                        continue
                    self._keep(decode(record.value() or b""))
        finally:
            consumer.close()

    def _keep(self, message: object) -> None:
        with self._lock:
            kept = self._kept
            if isinstance(message, Diagnosis):
                _append(kept.diagnoses, message)
            elif isinstance(message, Action):
                _append(kept.actions, message)
            elif isinstance(message, Route):
                _append(kept.routes, message)
            elif isinstance(message, Job):
                _append(kept.jobs, message)
            else:
                kept.rejected += 1


def _append(items: list[Any], item: Any) -> None:
    items.append(item)
    if len(items) > MAX_KEPT:
        del items[: len(items) - MAX_KEPT]
