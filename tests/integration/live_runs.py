"""Live runs for the integration tests: a simulated scenario published in event time, the
diagnoses read back, and the replay of the same events for comparison."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from producers.publisher import paced
from schemas.base import C4Model
from schemas.codec import decode, encode, key_of
from schemas.messages import Diagnosis
from simulator import scenario_from
from simulator.cluster import Cluster, build_cluster
from simulator.run import simulate_cluster
from streams.core.engine import Engine
from tests.integration.workers import create_topics

KINDS = ("collective", "link", "gpu", "job", "route", "deadletter", "diagnosis")
Finding = tuple[str, str | None, tuple[str, ...]]


@dataclass
class SimulatedRun:
    """A scenario's cluster, messages and what the replay concludes from them."""

    cluster: Cluster
    messages: list[C4Model]
    replay: list[Diagnosis] = field(default_factory=list)

    @classmethod
    def of(cls, document: dict[str, Any]) -> SimulatedRun:
        scenario = scenario_from(document)
        cluster = build_cluster(None, scenario)
        run = cls(cluster, list(simulate_cluster(cluster, scenario)))
        engine = Engine(topology=cluster.topology)
        run.replay = [d for m in run.messages for d in engine.process(m)]
        return run

    def topology_json(self) -> bytes:
        return orjson.dumps(self.cluster.topology.model_dump(mode="json", by_alias=True))


def findings(diagnoses: list[Diagnosis]) -> set[Finding]:
    """What was concluded: class, job and suspects of each firing diagnosis."""
    return {
        (d.class_, d.job, tuple(s.id for s in d.suspects)) for d in diagnoses if d.state == "firing"
    }


def topic_env(bootstrap: str, prefix: str, app_id: str, partitions: int) -> dict[str, str]:
    """Create the run's topics; the environment of `tests.integration.detect_app`."""
    create_topics(bootstrap, [f"{prefix}.{kind}" for kind in KINDS], partitions)
    return {
        "C4_TEST_TOPIC_PREFIX": prefix,
        "C4_TEST_APP_ID": app_id,
        "C4_KAFKA_BOOTSTRAP": bootstrap,
        "C4_TEST_PARTITIONS": str(partitions),
    }


class PacedPublisher(threading.Thread):
    """Publishes the messages ``speed`` x real time in a thread; ``hold()`` waits for a mark."""

    def __init__(self, bootstrap: str, prefix: str, messages: list[C4Model], speed: float):
        super().__init__(daemon=True)
        self._messages = messages
        self._speed = speed
        self._producer = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "linger.ms": 5,
                "partitioner": "murmur2_random",
            }
        )
        self._prefix = prefix
        self.published_ns = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for message in paced(self._messages, self._speed):
                topic = f"{self._prefix}.{message.kind}"  # type: ignore[attr-defined]
                self._producer.produce(topic, key=key_of(message).encode(), value=encode(message))
                self._producer.poll(0)
                self.published_ns = int(getattr(message, "ts_ns", 0))
            self._producer.flush(30)
        except BaseException as error:  # noqa: BLE001 - reported by the test thread
            self.error = error


class DiagnosisReader:
    """Reads the diagnosis topic from the start; `until` polls until a condition holds."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self._consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
        )
        self._consumer.subscribe([topic])
        self.found: list[Diagnosis] = []

    def until(
        self,
        done: Callable[[list[Diagnosis]], bool],
        timeout_s: float,
        alive: Callable[[], None] = lambda: None,
    ) -> list[Diagnosis]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not done(self.found):
            record = self._consumer.poll(0.5)
            if record is None or record.error() is not None:
                alive()
                continue
            result = decode(record.value())
            assert isinstance(result, Diagnosis), result
            self.found.append(result)
        return self.found

    def close(self) -> None:
        self._consumer.close()


def publish(bootstrap: str, topic_of: Callable[[C4Model], str], messages: list[C4Model]) -> None:
    """Publish every message at once (keyed and partitioned as the contract says)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
        }
    )
    for message in messages:
        producer.produce(topic_of(message), key=key_of(message).encode(), value=encode(message))
        producer.poll(0)
    assert producer.flush(30) == 0


def wait_for_members(
    bootstrap: str, group: str, members: int, alive: Callable[[], None], timeout_s: float = 90
) -> None:
    """Until the consumer group is stable with ``members`` members, each with partitions."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        alive()
        try:
            description = admin.describe_consumer_groups([group])[group].result(10)
        except (TimeoutError, KafkaException):  # a busy broker: asked again until the deadline
            time.sleep(0.5)
            continue
        assigned = [m for m in description.members if m.assignment.topic_partitions]
        if str(description.state).endswith("STABLE") and len(assigned) == members:
            return
        time.sleep(0.5)
    message = f"group {group} not stable with {members} members in {timeout_s} s"
    raise AssertionError(message)
