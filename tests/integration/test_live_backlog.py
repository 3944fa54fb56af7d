"""Live equal to offline on the arrival orders a backlog takes: a recorded stream of several
jobs, published in one burst (before the worker starts, or while it runs), with the node-keyed
topics (link, gpu) and the job-keyed ones (collective, job) at different paces, or one
partition far behind the others, gives the findings `c4 diagnose` prints for the same file.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient

from schemas.base import C4Model
from schemas.codec import decode, encode, key_of
from schemas.messages import Diagnosis
from streams.detection_app import partition_of
from tests.backlog_scenario import SCENARIO
from tests.integration.live_runs import (
    DiagnosisReader,
    SimulatedRun,
    findings,
    publish,
    topic_env,
)
from tests.integration.workers import REPO, FaustWorker

PARTITIONS = 4


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[C4Model], set[Any]]:
    """The recorded stream and what `c4 diagnose` concludes from its file."""
    run = SimulatedRun.of(SCENARIO)
    path = tmp_path_factory.mktemp("backlog") / "run.jsonl"
    path.write_bytes(b"".join(encode(m) + b"\n" for m in run.messages))
    diagnosed = subprocess.run(
        [sys.executable, "-m", "c4.cli", "diagnose", str(path)],
        cwd=REPO,
        capture_output=True,
        timeout=120,
        check=True,
    )
    replayed = [decode(line) for line in diagnosed.stdout.splitlines() if line.strip()]
    assert all(isinstance(d, Diagnosis) for d in replayed)
    expected = findings([d for d in replayed if isinstance(d, Diagnosis)])
    assert {cls for cls, _, _ in expected} == {
        "noncomm_hang",
        "gpu_fault",
        "comm_hang",
        "link_down",
        "noncomm_slow",
        "comm_slow",
        "link_degraded",
        "node_down",
    }
    return run.messages, expected


def consumed(bootstrap: str, group: str, topics: dict[str, int]) -> Callable[[], bool]:
    """Whether the group committed every record of these topics (name -> records)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})

    def done() -> bool:
        request = ConsumerGroupTopicPartitions(
            group,
            [TopicPartition(t, p) for t in topics for p in range(PARTITIONS)],
        )
        result = admin.list_consumer_group_offsets([request])[group].result(10)
        committed: dict[str, int] = {}
        for tp in result.topic_partitions:
            committed[tp.topic] = committed.get(tp.topic, 0) + max(tp.offset, 0)
        return all(committed.get(t, 0) >= n for t, n in topics.items())

    return done


def wait(condition: Callable[[], bool], alive: Callable[[], None], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        alive()
        assert time.monotonic() < deadline, "the worker did not consume the first burst"
        time.sleep(0.5)


ORDERS = ("backlog_placements_last", "hardware_first_then_collectives", "one_partition_behind")


@pytest.mark.parametrize("order", ORDERS)
def test_backlog_in_any_order_finds_what_diagnose_finds(
    recorded: tuple[list[C4Model], set[Any]],
    order: str,
    kafka_bootstrap: str,
    unique: str,
    tmp_path: Path,
) -> None:
    messages, expected = recorded
    prefix = f"test.{unique}"
    app_id = f"test-{unique}"
    env = topic_env(kafka_bootstrap, prefix, app_id, PARTITIONS)
    env["C4_TEST_DATADIR"] = str(tmp_path / "faust")

    def topic_of(message: C4Model) -> str:
        return f"{prefix}.{message.kind}"  # type: ignore[attr-defined]

    def of(*kinds: str) -> list[C4Model]:
        return [m for m in messages if m.kind in kinds]  # type: ignore[attr-defined]

    if order == "backlog_placements_last":
        # Every record in the topics before the worker starts; the placements last.
        publish(kafka_bootstrap, topic_of, of("collective") + of("gpu", "link") + of("job"))
    with FaustWorker("tests.integration.detect_app", env, tmp_path / "worker.log") as worker:
        if order == "hardware_first_then_collectives":
            # The placements and the node-keyed topics' burst are read to their end before
            # the collectives' burst comes.
            first = of("job", "link", "gpu")
            publish(kafka_bootstrap, topic_of, first)
            counts = {topic_of(m): 0 for m in first}
            for m in first:
                counts[topic_of(m)] += 1
            wait(consumed(kafka_bootstrap, app_id, counts), worker.assert_alive, 90)
            publish(kafka_bootstrap, topic_of, of("collective"))
        elif order == "one_partition_behind":
            # Every partition but one of each topic first; that one far behind, later.
            lagging = partition_of("job-b", PARTITIONS)

            def behind(m: C4Model) -> bool:
                return partition_of(key_of(m), PARTITIONS) == lagging

            ahead = [m for m in messages if not behind(m)]
            publish(kafka_bootstrap, topic_of, ahead)
            counts = {topic_of(m): 0 for m in ahead}
            for m in ahead:
                counts[topic_of(m)] += 1
            wait(consumed(kafka_bootstrap, app_id, counts), worker.assert_alive, 90)
            publish(kafka_bootstrap, topic_of, [m for m in messages if behind(m)])
        reader = DiagnosisReader(kafka_bootstrap, f"{prefix}.diagnosis", f"check-{unique}")
        reader.until(lambda found: findings(found) >= expected, 90, worker.assert_alive)
        # A little longer: a false finding would come after the expected ones.
        reader.until(lambda found: False, 3, worker.assert_alive)
        reader.close()
    found = reader.found
    assert findings(found) == expected
    keys = [(d.id, d.state) for d in found]
    assert len(keys) == len(set(keys)), "a diagnosis was published twice"
