"""The Kafka edge every c4 producer shares: topic names, records, a full local queue."""

from __future__ import annotations

from typing import Any

import orjson

from schemas.codec import decode
from schemas.edge import PRODUCER_SETTINGS, produce_waiting, record_of
from schemas.messages import Diagnosis
from schemas.topics import ALL_TOPICS, COLLECTIVE, TopicNames
from tests.contract import contract_examples


def test_topic_names_put_the_prefix_on_every_name_once() -> None:
    here = TopicNames("staging.")
    assert here.of(COLLECTIVE) == "staging.c4.collective.v1"
    assert here.of_kind("collectives") == here.of_kind("collective")  # a batch: same topic
    assert here.by_kind() == {t.kind: f"staging.{t.name}" for t in ALL_TOPICS}
    assert TopicNames().of_kind("deadletter") == "c4.deadletter.v1"


def test_a_record_is_its_kinds_topic_its_contract_key_and_its_json() -> None:
    # The contract's last diagnosis example, as a job's finding and as a fabric-wide one
    # (no job): keyed by the job, else "fabric".
    example = contract_examples()["diagnosis"]
    for job, expected in (("job-42", b"job-42"), (None, b"fabric")):
        message = decode(orjson.dumps({**example, "job": job}))
        assert isinstance(message, Diagnosis)
        topic, key, value = record_of(message, TopicNames("p."))
        assert (topic, key) == ("p.c4.diagnosis.v1", expected)
        assert decode(value) == message
        assert record_of(message, TopicNames(), key="other")[1] == b"other"


class FullQueue:
    """A producer whose local queue is full for its first ``full`` calls."""

    def __init__(self, full: int) -> None:
        self.full = full
        self.polls: list[float] = []
        self.queued: list[tuple[str, bytes, bytes]] = []

    def produce(self, topic: str, value: bytes, key: bytes, on_delivery: Any) -> None:
        if self.full:
            self.full -= 1
            raise BufferError
        self.queued.append((topic, key, value))

    def poll(self, timeout: float) -> int:
        self.polls.append(timeout)
        return 0


def test_a_full_local_queue_is_waited_out_not_dropped() -> None:
    producer = FullQueue(full=3)
    produce_waiting(producer, "t", b"v", b"k", lambda *_: None)
    assert producer.queued == [("t", b"k", b"v")]
    assert producer.polls == [0.1, 0.1, 0.1, 0]  # served reports while full, then once
    assert PRODUCER_SETTINGS["enable.idempotence"] is True
    assert PRODUCER_SETTINGS["partitioner"] == "murmur2_random"
