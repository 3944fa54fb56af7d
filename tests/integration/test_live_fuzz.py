"""Structured fuzz between valid records, on the real broker, through the real worker.

Hypothesis draws hostile records (random bytes, deep nesting, NaN, huge integers, truncated
JSON, wrong types and out-of-range fields of a real collective, unknown kinds) and where they
go among a job's valid reports. Every bad record must come back as one dead letter with a
reason and be counted (``c4_stream_rejected_total``); every valid one must be processed
(the findings are the replay's and ``c4_stream_messages_total`` counts them all); the worker
stays up; and the lag metric, once it all is read, says nothing is behind.
"""

from __future__ import annotations

import socket
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, Producer
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from schemas.codec import decode, encode, key_of
from schemas.messages import Collective, Deadletter, Diagnosis
from schemas.records import Rejected, decode_record
from streams.core.engine import Engine
from tests.integration.workers import FaustWorker, create_topics
from tests.unit.ring_job import RingJob

pytestmark = pytest.mark.integration

KINDS = ("collective", "link", "gpu", "job", "route", "deadletter", "diagnosis")
FUZZ_JOB = "job-fuzz"  # a record that slipped through as valid would show as this job


def collective_document() -> dict[str, Any]:
    return {
        "v": 1,
        "kind": "collective",
        "job": FUZZ_JOB,
        "comm": "c9",
        "comm_size": 4,
        "rank": 1,
        "global_rank": 1,
        "ts_ns": 1_733_130_000_000_000_000,
        "ops": {"seq": [1], "op": ["allreduce"], "bytes": [8], "enter_ns": [1], "end_ns": [2]},
    }


# Each breaks a valid collective in one certain way.
BREAKS: list[tuple[str, Any]] = [
    ("rank", 4),  # >= comm_size
    ("rank", -1),
    ("rank", "1"),
    ("comm_size", 0),
    ("ts_ns", "HUGE"),  # 2**64, written into the text (orjson does not encode it)
    ("ts_ns", 1.5),
    ("v", 2),
    ("kind", "collectivez"),
    ("ops", {"seq": [1, 2], "op": ["allreduce"], "bytes": [8], "enter_ns": [1], "end_ns": [2]}),
    ("ops", []),
    ("job", ""),
    ("job", "x" * 10_000),
]


def deep(levels: int, array: bool) -> bytes:
    if array:
        return b"[" * levels + b"]" * levels
    return b'{"a":' * levels + b"1" + b"}" * levels


def broken(index: int, extra: str) -> bytes:
    field, value = BREAKS[index]
    document = collective_document()
    document[field] = value
    document["note"] = extra
    return orjson.dumps(document).replace(b'"HUGE"', str(2**64).encode())


HOSTILE_KINDS = (
    st.binary(min_size=1, max_size=300).filter(lambda b: b.strip() != b""),
    st.builds(deep, st.integers(33, 5000), st.booleans()),
    st.just(deep(1000, array=False)),  # past the interpreter's recursion bound in msgspec
    st.builds(broken, st.integers(0, len(BREAKS) - 1), st.text(max_size=20)),
    st.just(b'{"v": 1, "kind": "collective", "rank": NaN}'),
    st.builds(lambda n: orjson.dumps(collective_document())[:n], st.integers(1, 200)),
    st.builds(lambda s: orjson.dumps({"v": 1, "kind": s}), st.text(max_size=30)),
    st.just(b"\xff\xfe\x00{"),
)


def rejected_whole(record: bytes) -> bool:
    """The codec rejects the record as one dead letter (hypothesis may draw valid bytes:
    it tries the constants it finds in the code, a valid report among them)."""
    results = decode_record(record, "collective")
    return len(results) == 1 and isinstance(results[0], Rejected)


# Every kind in every example (hypothesis's first example of a one_of is its simplest
# branch over and over): 10 to 30 of each, shuffled among the valid records below.
HOSTILE = st.tuples(
    *(st.lists(kind.filter(rejected_whole), min_size=10, max_size=30) for kind in HOSTILE_KINDS)
).map(lambda lists: [record for each in lists for record in each])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    """Sum of each sample name's values (over labels), plus per-label lag samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:  # noqa: S310
        text = answer.read().decode()
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name == "c4_stream_messages_total":
                name = f"{name}:{sample.labels.get('kind')}"
            if name == "c4_stream_consumer_lag":
                name = f"{name}:{sample.labels.get('topic')}"
            totals[name] = totals.get(name, 0.0) + sample.value
    return totals


@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.generate],  # live runs: no shrinking (each would run the worker again)
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile=HOSTILE, spots=st.randoms(use_true_random=False))
def test_fuzz_between_valid_records_is_dead_lettered_counted_and_the_rest_processed(
    kafka_bootstrap: str, unique: str, tmp_path: Path, hostile: list[bytes], spots: Any
) -> None:
    prefix = f"test.{unique}.{uuid.uuid4().hex[:6]}"  # each example its own topics and group
    create_topics(kafka_bootstrap, [f"{prefix}.{kind}" for kind in KINDS])
    job = RingJob(stuck_rank={11: 40})
    valid = [job.job_message(), *job.messages()]
    engine = Engine()
    expected = [d for m in valid for d in engine.process(m)] + engine.check(engine.now_ns)
    wanted = {(d.id, d.class_, d.suspects[0].id) for d in expected if d.state == "firing"}
    assert wanted

    # The hostile records go between the job's reports, where hypothesis says.
    records: list[tuple[str, bytes, bytes]] = [
        (f"{prefix}.{m.kind}", key_of(m).encode(), encode(m)) for m in valid
    ]
    for number, value in enumerate(hostile):
        at = spots.randint(1, len(records))
        records.insert(at, (f"{prefix}.collective", f"fuzz-{number}".encode(), value))
    port = free_port()
    env = {
        "C4_TEST_TOPIC_PREFIX": prefix,
        "C4_TEST_APP_ID": f"test-{prefix}",
        "C4_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "C4_TEST_METRICS_PORT": str(port),
    }
    log = tmp_path / "worker.log"
    found: list[Diagnosis] = []
    letters: dict[bytes, list[Deadletter]] = {}
    collectives = sum(isinstance(m, Collective) for m in valid)
    metrics: dict[str, float] = {}
    with FaustWorker("tests.integration.detect_app", env, log) as worker:
        producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
        for topic, key, value in records:
            producer.produce(topic, key=key, value=value)
            producer.poll(0)
        assert producer.flush(30) == 0
        consumer = Consumer(
            {
                "bootstrap.servers": kafka_bootstrap,
                "group.id": f"check-{prefix}",
                "auto.offset.reset": "earliest",
            }
        )
        consumer.subscribe([f"{prefix}.diagnosis", f"{prefix}.deadletter"])

        def done() -> bool:
            firing = {(d.id, d.class_, d.suspects[0].id) for d in found if d.state == "firing"}
            return (
                wanted <= firing
                and len(letters) >= len(hostile)
                and metrics.get("c4_stream_messages_total:collective", 0) >= collectives
                and metrics.get(f"c4_stream_consumer_lag:{prefix}.collective", -1) == 0
            )

        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and not done():
            record = consumer.poll(0.5)
            if record is None or record.error() is not None:
                worker.assert_alive()
                try:
                    metrics = scrape(port)
                except OSError:
                    continue  # the worker is still starting its metrics server
                continue
            result = decode(record.value())
            if isinstance(result, Diagnosis):
                found.append(result)
            elif isinstance(result, Deadletter):
                letters.setdefault(record.key() or b"", []).append(result)
        consumer.close()
        worker.assert_alive()
        metrics = scrape(port)

    firing = {(d.id, d.class_, d.suspects[0].id) for d in found if d.state == "firing"}
    assert firing == wanted, "every valid record processed: the replay's findings"
    assert all(d.job == job.job for d in found), "no hostile record read as a job's report"
    assert sorted(letters) == sorted(f"fuzz-{n}".encode() for n in range(len(hostile)))
    assert all(len(each) == 1 and each[0].error for each in letters.values())
    assert metrics["c4_stream_rejected_total"] == len(hostile)
    assert metrics["c4_stream_messages_total:collective"] == collectives
    assert metrics[f"c4_stream_consumer_lag:{prefix}.collective"] == 0
    text = log.read_text(errors="replace")
    assert "RecursionError" not in text and "crashed" not in text.lower(), text[-3000:]
