from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from schemas.codec import decode, encode, key_of
from schemas.messages import Diagnosis
from streams.core.engine import Engine
from tests.unit.ring_job import RingJob

REPO = Path(__file__).resolve().parents[2]
KINDS = ("collective", "link", "gpu", "job", "route", "deadletter", "diagnosis")


def test_live_worker_finds_what_the_replay_finds(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    prefix = f"test.{unique}"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    futures = admin.create_topics(
        [NewTopic(f"{prefix}.{kind}", num_partitions=4, replication_factor=1) for kind in KINDS]
    )
    for future in futures.values():
        future.result(30)
    job = RingJob(stuck_rank={11: 40}, slow_rank={5: (5, 1.2)})
    messages = [job.job_message(), *job.messages()]
    # The replay of the same events: what the live worker must publish too.
    engine = Engine()
    expected = [d for m in messages for d in engine.process(m)]
    expected += engine.check(engine.now_ns)
    assert {d.class_ for d in expected} == {"noncomm_hang", "noncomm_slow"}

    env = dict(
        os.environ,
        C4_TEST_TOPIC_PREFIX=prefix,
        C4_TEST_APP_ID=f"test-{unique}",
        C4_KAFKA_BOOTSTRAP=kafka_bootstrap,
        PYTHONPATH=str(REPO),
    )
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log_file:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.integration.detect_app",
                "worker",
                "-l",
                "warn",
                "--without-web",
            ],
            cwd=REPO,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        try:
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
            found: list[Diagnosis] = []
            deadline = time.monotonic() + 90
            wanted = {(d.id, d.state) for d in expected if d.state == "firing"}
            while time.monotonic() < deadline and not wanted <= {(d.id, d.state) for d in found}:
                record = consumer.poll(0.5)
                if record is None or record.error() is not None:
                    assert worker.poll() is None, log_path.read_text(errors="replace")[-3000:]
                    continue
                result = decode(record.value())
                assert isinstance(result, Diagnosis)
                assert record.key() == b"job-1"
                found.append(result)
            consumer.close()
        finally:
            worker.terminate()
            worker.wait(30)
    firing = [d for d in found if d.state == "firing"]
    assert sorted((d.id, d.class_, d.suspects[0].id) for d in firing) == sorted(
        (d.id, d.class_, d.suspects[0].id) for d in expected if d.state == "firing"
    )
    assert len(firing) == len({d.id for d in firing})  # each finding published once
