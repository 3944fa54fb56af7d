from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest
from confluent_kafka import Consumer, Producer

from schemas.codec import Rejection, decode
from schemas.messages import Collective, Deadletter, Job
from tests.contract import contract_examples
from tests.integration.workers import FaustWorker, create_topics

pytestmark = pytest.mark.integration


def collective(job: str, seq: int) -> bytes:
    message = dict(contract_examples()["collective"], job=job)
    message["ops"] = dict(message["ops"], seq=[seq, seq + 1])
    return orjson.dumps(message)


def test_faust_agent_decodes_and_dead_letters(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    prefix = f"test.{unique}"
    names = [f"{prefix}.{kind}" for kind in ("collective", "link", "gpu", "job", "deadletter")]
    create_topics(kafka_bootstrap, [*names, f"{prefix}.echo"])
    env = {
        "C4_TEST_TOPIC_PREFIX": prefix,
        "C4_TEST_APP_ID": f"test-{unique}",
        "C4_KAFKA_BOOTSTRAP": kafka_bootstrap,
    }
    with FaustWorker("tests.integration.echo_app", env, tmp_path / "worker.log") as worker:
        producer = Producer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
            }
        )
        sent_partitions: dict[bytes, int] = {}

        def delivered(error: object, record: object) -> None:
            assert error is None
            sent_partitions[record.key()] = record.partition()  # type: ignore[attr-defined]

        jobs = [f"job-{i}" for i in range(6)]
        bad = orjson.dumps(dict(contract_examples()["collective"], rank=20))
        producer.produce(
            names[0], key=b"job-0", value=collective("job-0", 1), on_delivery=delivered
        )
        producer.produce(names[0], key=b"job-bad", value=bad, on_delivery=delivered)
        producer.produce(names[0], key=b"job-bad2", value=b"{not json", on_delivery=delivered)
        for job in jobs[1:]:
            producer.produce(
                names[0], key=job.encode(), value=collective(job, 7), on_delivery=delivered
            )
        # A batch: its two good messages are taken, its bad one dead-lettered alone.
        single = dict(contract_examples()["collective"], job="job-batch")
        batch = dict(contract_examples()["collectives"], job="job-batch")
        batch["messages"] = [dict(single, rank=5), dict(single, rank=16), dict(single, rank=6)]
        producer.produce(
            names[0], key=b"job-batch", value=orjson.dumps(batch), on_delivery=delivered
        )
        job_message = dict(contract_examples()["job"], comms={})
        producer.produce(
            names[3], key=b"job-explode", value=orjson.dumps(dict(job_message, job="job-explode"))
        )
        producer.produce(names[3], key=b"job-7", value=orjson.dumps(dict(job_message, job="job-7")))
        assert producer.flush(30) == 0

        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": f"check-{unique}",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([f"{prefix}.echo", f"{prefix}.deadletter"])
        echoed: dict[str, tuple[Collective, int]] = {}
        batch_ranks: list[int] = []
        jobs_echoed: list[str] = []
        letters: list[tuple[bytes, Deadletter]] = []
        deadline = time.monotonic() + 90
        while (
            len(echoed) < len(jobs) or len(letters) < 4 or not jobs_echoed or len(batch_ranks) < 2
        ) and time.monotonic() < deadline:
            record = consumer.poll(0.5)
            if record is None or record.error() is not None:
                worker.assert_alive()
                continue
            result = decode(record.value())
            assert not isinstance(result, Rejection), result.reason
            if isinstance(result, Collective) and result.job == "job-batch":
                batch_ranks.append(result.rank)
            elif isinstance(result, Collective):
                echoed[result.job] = (result, record.partition())
            elif isinstance(result, Job):
                jobs_echoed.append(result.job)
            else:
                assert isinstance(result, Deadletter)
                letters.append((record.key(), result))
        consumer.close()

    assert sorted(echoed) == sorted(jobs)
    model, partition = echoed["job-0"]
    assert model.ops.seq == (1, 2) and model.rank == 3
    for job, (_, echo_partition) in echoed.items():
        # Faust (murmur2) put each key in the partition the confluent producer chose.
        assert echo_partition == sent_partitions[job.encode()]
    by_key = {key: letter for key, letter in letters}
    assert by_key[b"job-bad"].error == "rank: 20 >= comm_size 16"
    assert by_key[b"job-bad"].topic == names[0]
    assert orjson.loads(by_key[b"job-bad"].payload)["rank"] == 20
    assert by_key[b"job-bad2"].error.startswith("invalid JSON")
    assert by_key[b"job-bad2"].payload == "{not json"
    # A handler that raises dead-letters its record; the agent goes on with the next one.
    assert by_key[b"job-explode"].error == "RuntimeError: handler failure injected by the test"
    assert by_key[b"job-explode"].topic == names[3]
    assert jobs_echoed == ["job-7"]
    assert batch_ranks == [5, 6]
    in_batch = by_key[b"job-batch"]
    assert in_batch.error == "messages[1].rank: 16 >= comm_size 16"
    assert orjson.loads(in_batch.payload) == dict(single, rank=16)
