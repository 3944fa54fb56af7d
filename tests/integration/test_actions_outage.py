"""The worker goes on through a Redis restart and a Kafka restart (a private stack, kill -9)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.integration.actions_harness import (
    Cluster,
    HttpReceiver,
    config,
    diagnosis,
    wait_for,
    worker,
)
from tests.integration.private_stack import PrivateStack

pytestmark = pytest.mark.integration


def committed(cluster: Cluster, group: str) -> int:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    try:
        [partition] = consumer.committed([TopicPartition(cluster.topic("diagnosis"), 0)], 20)
        return int(partition.offset)
    finally:
        consumer.close()


def test_worker_survives_a_redis_restart_and_a_kafka_restart(
    private_stack: PrivateStack, unique: str, tmp_path: Path
) -> None:
    cluster = Cluster(private_stack.bootstrap, private_stack.redis_url, unique)
    receiver = HttpReceiver()
    try:
        cluster.spares("node-011", "node-012")
        with worker(cluster, config(receiver)) as metrics:
            cluster.job("job-r", ["node-008", "node-009", "node-010"])
            time.sleep(1.5)  # appendfsync everysec: the setup reaches Redis's append-only file

            private_stack.stop("redis")
            cluster.send("diagnosis", diagnosis("d-r1", "job-r", [("gpu", "node-009/gpu0", 0.9)]))
            wait_for(lambda: metrics.retries.labels("redis")._value.get() > 0, what="a retry")
            assert cluster.actions() == []  # nothing recorded while Redis is away
            private_stack.start()
            first = cluster.wait_actions(3)
            assert sorted((a.action, a.status) for a in first) == [
                ("alert", "done"),
                ("isolate", "done"),
                ("restart", "done"),
            ]
            wait_for(lambda: committed(cluster, f"actions-{unique}") == 1, what="commit of d-r1")

            private_stack.stop("kafka")
            private_stack.start()
            cluster.send("diagnosis", diagnosis("d-r2", "job-r", [("gpu", "node-010/gpu1", 0.9)]))
            both = cluster.wait_actions(6, timeout_s=90)
            wait_for(lambda: committed(cluster, f"actions-{unique}") == 2, 60, "commit of d-r2")

        second = [a for a in both if a.diagnosis == "d-r2"]
        assert sorted((a.action, a.status) for a in second) == [
            ("alert", "done"),
            ("isolate", "done"),
            ("restart", "done"),
        ]
        placement = cluster.state.jobs.placement("job-r")
        assert placement is not None
        assert sorted({p.node for p in placement.values()}) == ["node-008", "node-011", "node-012"]
        assert cluster.state.snapshot()["spares"] == []
        assert len(receiver.at("/launch")) == 2
    finally:
        receiver.close()
        cluster.close()
