"""Scaled out, a port's finding waits for the placement another worker has still to share.

Worker A owns the job topic's partition of the job, worker B the link partition of the
node. A is paused (SIGSTOP) before it reads the job's placement, while B reads link
reports that degrade the job's port: B must hold the finding (not publish it job-less, as
it would with only its own partitions to go by) until A, resumed, has put the placement
into the shared facts; then it names the job, once.
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from pathlib import Path

from confluent_kafka.admin import AdminClient

from schemas.base import C4Model
from schemas.messages import Job, Link, LinkCounters, RankPlace
from streams.detection_app import partition_of
from tests.integration.live_runs import DiagnosisReader, publish, topic_env
from tests.integration.workers import FaustWorker

PARTITIONS = 8
S = 1_000_000_000


def owned_partitions(
    bootstrap: str, group: str, topic: str, timeout_s: float = 90
) -> dict[str, set[int]]:
    """client id -> the partitions of ``topic`` it owns, once both members have some."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        description = admin.describe_consumer_groups([group])[group].result(10)
        owned = {
            m.client_id: {tp.partition for tp in m.assignment.topic_partitions if tp.topic == topic}
            for m in description.members
        }
        if str(description.state).endswith("STABLE") and sum(map(bool, owned.values())) == 2:
            return owned
        time.sleep(0.5)
    message = f"group {group} not stable with two members in {timeout_s} s"
    raise AssertionError(message)


def first_key(prefix: str, partitions: set[int]) -> str:
    """The first of prefix-0, prefix-1, ... that the murmur2 partitioner puts in one of them."""
    keys = (f"{prefix}-{i}" for i in range(1000))
    return next(key for key in keys if partition_of(key, PARTITIONS) in partitions)


def degrading_port(node: str, port: str, start_ns: int) -> list[C4Model]:
    """Twenty seconds of reports of one port, its symbol errors climbing from second 5."""
    reports: list[C4Model] = []
    errors = 0
    for second in range(20):
        errors += 50 if second >= 5 else 0
        reports.append(
            Link(
                v=1,
                kind="link",
                node=node,
                port=port,
                ts_ns=start_ns + second * S,
                state="up",
                gbps=200,
                counters=LinkCounters(link_down=0, symbol_err=errors),
            )
        )
    return reports


def test_a_port_finding_waits_for_the_placement_the_other_worker_shares(
    kafka_bootstrap: str, unique: str, tmp_path: Path
) -> None:
    prefix = f"test.{unique}"
    group = f"test-{unique}"
    env = topic_env(kafka_bootstrap, prefix, group, PARTITIONS)
    env["C4_TEST_DATADIR"] = str(tmp_path / "faust")
    with ExitStack() as stack:
        workers = {
            name: stack.enter_context(
                FaustWorker(
                    "tests.integration.detect_app",
                    {**env, "C4_TEST_CLIENT_ID": name},
                    tmp_path / f"{name}.log",
                )
            )
            for name in ("worker-a", "worker-b")
        }
        # Partition p of every input topic goes to one worker (see streams.detection_app).
        owned = owned_partitions(kafka_bootstrap, group, f"{prefix}.link")
        job = first_key("job", owned["worker-a"])
        node = first_key("node", owned["worker-b"])
        port = "mlx5_0:1"
        start_ns = time.time_ns()
        placement = Job(
            v=1,
            kind="job",
            job=job,
            ts_ns=start_ns,
            state="running",
            ranks=(RankPlace(rank=0, node=node, gpu=0, port=port),),
            comms={},
        )
        reader = DiagnosisReader(kafka_bootstrap, f"{prefix}.diagnosis", f"check-{unique}")
        stack.callback(reader.close)
        paused = workers["worker-a"]
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            publish(kafka_bootstrap, lambda m: f"{prefix}.{m.kind}", [placement])  # type: ignore[attr-defined]
            publish(
                kafka_bootstrap,
                lambda m: f"{prefix}.{m.kind}",  # type: ignore[attr-defined]
                degrading_port(node, port, start_ns),
            )
            held = reader.until(lambda found: bool(found), 8, workers["worker-b"].assert_alive)
            assert held == [], "B published the port's finding before it knew the placement"
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        found = reader.until(lambda found: bool(found), 60, paused.assert_alive)
        reader.until(lambda found: False, 2)  # a second (job-less) one would come now
    assert [(d.class_, d.job, d.suspects[0].id) for d in found] == [
        ("link_degraded", job, f"{node}/{port}")
    ]
