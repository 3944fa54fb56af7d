from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, Producer

from schemas.codec import decode, encode, key_of
from schemas.messages import Diagnosis
from streams.core.engine import Engine
from tests.integration.workers import FaustWorker, create_topics
from tests.unit.ring_job import RingJob

KINDS = ("collective", "link", "gpu", "job", "route", "deadletter", "diagnosis")


def test_live_worker_finds_what_the_replay_finds(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    prefix = f"test.{unique}"
    create_topics(kafka_bootstrap, [f"{prefix}.{kind}" for kind in KINDS])
    job = RingJob(stuck_rank={11: 40}, slow_rank={5: (5, 1.2)})
    messages = [job.job_message(), *job.messages()]
    # The replay of the same events: what the live worker must publish too.
    engine = Engine()
    expected = [d for m in messages for d in engine.process(m)]
    expected += engine.check(engine.now_ns)
    assert {d.class_ for d in expected} == {"noncomm_hang", "noncomm_slow"}

    env = {
        "C4_TEST_TOPIC_PREFIX": prefix,
        "C4_TEST_APP_ID": f"test-{unique}",
        "C4_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    found: list[Diagnosis] = []
    with FaustWorker("tests.integration.detect_app", env, tmp_path / "worker.log") as worker:
        producer = Producer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
            }
        )
        for message in messages:
            producer.produce(
                f"{prefix}.{message.kind}", key=key_of(message).encode(), value=encode(message)
            )
            producer.poll(0)
        assert producer.flush(30) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": f"check-{unique}",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([f"{prefix}.diagnosis"])
        wanted = {(d.id, d.state) for d in expected if d.state == "firing"}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not wanted <= {(d.id, d.state) for d in found}:
            record = consumer.poll(0.5)
            if record is None or record.error() is not None:
                worker.assert_alive()
                continue
            result = decode(record.value())
            assert isinstance(result, Diagnosis)
            assert record.key() == b"job-1"
            found.append(result)
        consumer.close()
    firing = [d for d in found if d.state == "firing"]
    assert sorted((d.id, d.class_, d.suspects[0].id) for d in firing) == sorted(
        (d.id, d.class_, d.suspects[0].id) for d in expected if d.state == "firing"
    )
    assert len(firing) == len({d.id for d in firing})  # each finding published once
